"""The zygote protocol's bounds: what a program writes is validated item by item, and a run's
answer always fits one control frame, whatever the request asked and the program left."""

from __future__ import annotations

import base64

from sandbox_service.jail.protocol import (
    HEADER,
    MAX_FRAME_BYTES,
    Fetched,
    Outputs,
    RunReply,
    decode_body,
    encode_frame,
    reply_frame,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()


def test_outputs_keep_valid_items_and_name_the_dropped_ones() -> None:
    outputs = Outputs.from_wire(
        {
            "display": [
                {"image/png": "%%% not base64"},
                {"image/png": base64.b64encode(b"GIF89a").decode()},
                {"image/png": PNG, "text/plain": "figure"},
                {"text/html": "<script>"},
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
