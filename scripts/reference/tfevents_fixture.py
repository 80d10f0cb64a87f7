"""Writes crates/rlft-train/tests/fixtures/tb_python.tfevents with TensorBoard's own writer.

`tests/tensorboard.rs` decodes it with rlft's reader and checks that rlft's encoder produces the
same bytes for the same events (it takes the wall time of the first, `file_version`, record from
the file). Needs only the `tensorboard` package (no TensorFlow):

    ~/.cache/rlft/reference/venv/bin/python -m pip install tensorboard
    ~/.cache/rlft/reference/venv/bin/python scripts/reference/tfevents_fixture.py
"""

import glob
import os
import shutil
import tempfile

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

OUT = os.path.join(
    os.path.dirname(__file__), "..", "..", "crates", "rlft-train", "tests", "fixtures", "tb_python.tfevents"
)


def scalars(step, wall_time, pairs):
    values = [summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in pairs]
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))


# Keep in sync with `expected_events()` in crates/rlft-train/tests/tensorboard.rs.
EVENTS = [
    scalars(1, 1714000001.25, [("train/loss", 2.5), ("train/learning_rate", 1e-5)]),
    scalars(2, 1714000002.5, [("train/loss", 0.0), ("train/grad_norm", -3.75)]),
    event_pb2.Event(wall_time=1714000003.0, step=3, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)),
    scalars(3, 1714000003.125, [("reward/mean \u00b1 std", 0.1), ("nan", float("nan"))]),
    scalars(2**40, 1714000004.0, [("eval/accuracy", 0.75)]),
    scalars(0, 0.0, [("zero", 1.0)]),
]


def main():
    with tempfile.TemporaryDirectory() as d:
        w = EventFileWriter(d)
        for e in EVENTS:
            w.add_event(e)
        w.close()
        (path,) = glob.glob(os.path.join(d, "events.out.tfevents.*"))
        shutil.copyfile(path, OUT)
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
