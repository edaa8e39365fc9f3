"""The clipped policy loss, checked against a token-by-token loop written from paper Eq. 6."""

from __future__ import annotations

import math

import pytest
import torch

from rl.loss import policy_loss


def loop_reference(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> tuple[float, dict[str, float]]:
    """sum over masked tokens of -min(rho A, clip(rho) A) [dual: min(., -c A) if A < 0] / count."""
    total, count = 0.0, 0
    clipped = low = high = dual = 0
    kl = 0.0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = float(adv[b]) if adv.ndim == 1 else float(adv[b, t])
            log_rho = float(logp[b, t] - old[b, t])
            rho = math.exp(log_rho)
            surrogate = rho * a
            clipped_surrogate = min(max(rho, 1 - eps_low), 1 + eps_high) * a
            token_loss = -min(surrogate, clipped_surrogate)
            if clipped_surrogate < surrogate:
                clipped += 1
                low += rho < 1 - eps_low
                high += rho > 1 + eps_high
            if dual_clip is not None and a < 0 and -dual_clip * a < token_loss:
                token_loss = -dual_clip * a
                dual += 1
            total += token_loss
            kl += (rho - 1) - log_rho
            count += 1
    n = max(count, 1)
    metrics = {
        "clip_frac": clipped / n,
        "clip_frac_low": low / n,
        "clip_frac_high": high / n,
        "dual_clip_frac": dual / n,
        "approx_kl": kl / n,
        "num_tokens": float(count),
    }
    return total / n, metrics


def random_batch(
    seed: int, per_token_adv: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 40
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    # log-ratios up to +-0.8: plenty of tokens beyond both clip ranges and beyond 3x
    logp = old + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 1.6
    shape = (b, t) if per_token_adv else (b,)
    adv = torch.randn(*shape, generator=g, dtype=torch.float64) * 1.5
    mask = torch.rand(b, t, generator=g) < 0.7  # prompt/tool-response/padding tokens at 0
    return logp, old, adv, mask


@pytest.mark.parametrize("dual_clip", [None, 3.0, 1.5])
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_loop_reference(
    dual_clip: float | None, per_token_adv: bool, seed: int
) -> None:
    logp, old, adv, mask = random_batch(seed, per_token_adv)
    loss, metrics = policy_loss(logp, old, adv, mask, dual_clip=dual_clip)
    expected, expected_metrics = loop_reference(logp, old, adv, mask, 0.2, 0.28, dual_clip)
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    assert metrics.as_dict() == pytest.approx(expected_metrics, rel=1e-6, abs=1e-9)
    assert 0 < expected_metrics["clip_frac"] < 1  # the batch exercises clipping


def test_gradient_is_zero_exactly_where_clipped() -> None:
    # A > 0 past 1 + eps_high and A < 0 below 1 - eps_low are clipped; the other two
    # directions are not (the surrogate is a min): PPO's asymmetry.
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.25, 1.1]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    logp = ratios.log().requires_grad_()
    loss, metrics = policy_loss(logp, old, adv, torch.ones_like(ratios, dtype=torch.bool))
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -rho*A/n = -rho*A/n
    expected = torch.tensor([[0.0, 1.5, -0.5, 0.0, -1.25, 1.1]], dtype=torch.float64) / 6
    torch.testing.assert_close(logp.grad, expected)
    assert metrics.clip_frac.item() == pytest.approx(2 / 6)
    assert metrics.clip_frac_high.item() == pytest.approx(1 / 6)
    assert metrics.clip_frac_low.item() == pytest.approx(1 / 6)


def test_clip_higher_lets_a_positive_token_rise_to_1_28() -> None:
    logp = torch.tensor([[math.log(1.25)]])
    zero, one, keep = torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1)
    loss, _ = policy_loss(logp, zero, one, keep)
    assert loss.item() == pytest.approx(-1.25)  # inside [0.8, 1.28]: not clipped
    loss, _ = policy_loss(logp, zero, one, keep, eps_high=0.2)
    assert loss.item() == pytest.approx(-1.2)  # symmetric PPO would clip it


def test_dual_clip_bounds_the_loss_of_a_negative_advantage() -> None:
    logp = torch.tensor([[math.log(5.0)]])
    zero, keep = torch.zeros(1, 1), torch.ones(1, 1)
    adv = torch.tensor([-1.0])
    assert policy_loss(logp, zero, adv, keep)[0].item() == pytest.approx(5.0)
    loss, metrics = policy_loss(logp, zero, adv, keep, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)
    assert metrics.dual_clip_frac.item() == 1.0


def test_masked_tokens_do_not_count() -> None:
    logp, old, adv, mask = random_batch(3)
    logp = logp.clone().requires_grad_()
    loss, metrics = policy_loss(logp, old, adv, mask)
    loss.backward()
    assert logp.grad is not None
    assert torch.all(logp.grad[~mask] == 0)
    assert metrics.num_tokens == int(mask.sum())
    changed = torch.where(mask, logp.detach(), logp.detach() + 5.0)  # move only masked-out ones
    assert policy_loss(changed, old, adv, mask)[0].item() == pytest.approx(loss.item())


def test_on_policy_loss_is_minus_the_token_mean_advantage() -> None:
    old = -torch.rand(3, 5, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    loss, metrics = policy_loss(old.clone(), old, adv, mask)
    # token mean: 2 tokens of 1.0, 4 of -2.0, 1 of 0.5
    assert loss.item() == pytest.approx(-(2 * 1.0 + 4 * -2.0 + 0.5) / 7)
    assert metrics.approx_kl.item() == 0.0 and metrics.clip_frac.item() == 0.0


def test_num_tokens_sets_the_denominator_for_accumulation() -> None:
    logp, old, adv, mask = random_batch(4)
    full, _ = policy_loss(logp, old, adv, mask)
    halves = [
        policy_loss(logp[s], old[s], adv[s], mask[s], num_tokens=float(mask.sum()))[0]
        for s in (slice(0, 3), slice(3, 6))
    ]
    assert (halves[0] + halves[1]).item() == pytest.approx(full.item(), rel=1e-9)


def test_empty_mask_and_bad_shapes() -> None:
    x = torch.zeros(2, 3)
    loss, metrics = policy_loss(x, x, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0 and metrics.num_tokens == 0
    with pytest.raises(ValueError):
        policy_loss(x, torch.zeros(2, 4), torch.ones(2), torch.ones(2, 3))
    with pytest.raises(ValueError):
        policy_loss(x, x, torch.ones(3), torch.ones(2, 3))
    with pytest.raises(ValueError):
        policy_loss(x, x, torch.ones(2), torch.ones(2, 3), dual_clip=1.0)
