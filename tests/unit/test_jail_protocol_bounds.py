"""The zygote protocol's bounds: what a program writes is validated item by item, and a run's
answer always fits one control frame, whatever the request asked and the program left."""

from __future__ import annotations

import base64

from sandbox_service.jail.inside.protocol import (
    HEADER,
    MAX_FETCH_PATHS,
    MAX_FRAME_BYTES,
    MAX_PATH_CHARS,
    FetchBudget,
    Fetched,
    Outputs,
    RunLimits,
    RunReply,
    RunRequest,
    decode_body,
    encode_frame,
    reply_frame,
)
from sandbox_service.settings import Settings

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()


def test_outputs_keep_valid_items_and_name_the_dropped_ones() -> None:
    outputs = Outputs.from_wire(
        {
            "display": [
                {"image/png": "%%% not base64"},
                {"image/png": base64.b64encode(b"GIF89a").decode()},
                {"image/png": PNG, "text/plain": "figure"},
                {"application/javascript": "alert(1)"},
                [],
            ],
            "error": {"ename": "E", "evalue": "v", "traceback": "not a list"},
        }
    )
    assert outputs.display == ({"image/png": PNG, "text/plain": "figure"},)
    assert outputs.error is None
    assert [note.split(":")[0] for note in outputs.dropped] == [
        "display[0]",
        "display[1]",
        "display[3]",
        "display[4]",
        "error",
    ]
    # The notes travel with the outputs (zygote -> worker) and are validated again there.
    assert Outputs.from_wire(outputs.to_wire()) == outputs


def _fits(reply: RunReply) -> RunReply:
    fitted, frame = reply_frame(reply)
    assert len(frame) <= MAX_FRAME_BYTES + HEADER.size
    assert RunReply.from_wire(decode_body(frame[HEADER.size :])) == fitted
    assert fitted.exit_code == reply.exit_code
    return fitted


def test_a_reply_over_the_frame_drops_the_displays_first() -> None:
    files = {f"f{i}": b"x" * (8 << 20) for i in range(4)}  # 32 MiB, 43 MiB in base64
    big_text = "\x01" * (6 << 20)  # JSON escapes each as \u0001: 36 MiB in the frame
    reply = RunReply(
        exit_code=0,
        fetched=Fetched(files=files, missing=("gone",)),
        outputs=Outputs(display=({"text/plain": big_text},)),
    )
    fitted = _fits(reply)
    assert fitted.outputs.display == ()
    assert any("did not fit" in note for note in fitted.outputs.dropped)
    assert fitted.fetched == reply.fetched


def test_a_reply_still_over_the_frame_drops_the_files_and_names_them() -> None:
    files = {"big": b"x" * (47 << 20)}  # the protocol's largest budget: 63 MiB in base64
    error = {"ename": "E", "evalue": "\x01" * (2 << 20), "traceback": []}
    reply = RunReply(
        exit_code=1,
        fetched=Fetched(files=files, missing=("gone",)),
        outputs=Outputs(error=error),
    )
    fitted = _fits(reply)
    assert fitted.outputs.error is None and fitted.fetched.files == {}
    assert fitted.fetched.missing == ("gone",)
    assert fitted.fetched.over_budget == ("big",)


def test_a_reply_that_fits_is_sent_as_it_is() -> None:
    reply = RunReply(exit_code=3, outputs=Outputs(display=({"image/png": PNG},)))
    fitted, frame = reply_frame(reply)
    assert fitted == reply and frame == encode_frame(reply.to_wire())


def test_non_ascii_text_costs_its_utf8_bytes_in_a_frame() -> None:
    path = "\U0001f600" * 1024
    frame = encode_frame({"op": "run", "fetch": [path]})
    assert len(frame) < 4 * 1024 + 64  # not 12 bytes a character as \\u escapes
    assert decode_body(frame[HEADER.size :])["fetch"] == [path]


def test_the_largest_valid_request_fits_the_jails_frame() -> None:
    # Every in-jail bound is at least what a valid request can produce: the largest input
    # files the settings allow, and the longest fetch list the jail takes, in one frame.
    largest_files = Settings.model_fields["max_files_bytes"].metadata
    files_bytes = next(m.le for m in largest_files if getattr(m, "le", None) is not None)
    request = RunRequest(
        limits=RunLimits(timeout_s=1.0, cpu_time_s=2, max_file_size_mb=64, max_open_files=256),
        files={"in.bin": b"\xff" * files_bytes},
        fetch=tuple(f"{i}" + "\U0001f600" * (MAX_PATH_CHARS - 4) for i in range(MAX_FETCH_PATHS)),
        fetch_budget=FetchBudget(max_files=4096, max_bytes=32 << 20),
    )
    frame = encode_frame(request.to_wire())
    assert len(frame) <= MAX_FRAME_BYTES
    assert RunRequest.from_wire(decode_body(frame[HEADER.size :])) == request


def test_keep_processes_travels_from_the_job_to_the_zygote() -> None:
    from sandbox_service.execution import Limits
    from sandbox_service.jobs import JobPayload

    payload = JobPayload(code="pass", session_id="s", keep_processes=True)
    wire = JobPayload.from_wire(payload.to_wire())
    assert wire.keep_processes and wire.to_spec("x", Limits()).keep_processes
    assert not JobPayload.from_wire(JobPayload(code="pass").to_wire()).keep_processes
    limits = RunLimits(timeout_s=1.0, cpu_time_s=2, max_file_size_mb=64, max_open_files=256)
    request = RunRequest(limits=limits, keep_processes=True)
    assert RunRequest.from_wire(request.to_wire()).keep_processes
    forged = {**request.to_wire(), "keep": "yes"}  # only a JSON true keeps
    assert not RunRequest.from_wire(forged).keep_processes
