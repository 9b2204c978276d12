"""Reading back the scalars a run wrote for TensorBoard, without TensorBoard."""

import struct
from pathlib import Path


def tensorboard_scalars(events_dir: Path) -> list[list[tuple[str, int]]]:
    """(tag, step) of every scalar, per event file (TFRecord framing, tensorboardX's proto)."""
    from tensorboardX.proto.event_pb2 import Event

    files = []
    for path in sorted(events_dir.glob("events.out.tfevents.*")):
        data, offset, scalars = path.read_bytes(), 0, []
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            scalars += [(value.tag, event.step) for value in event.summary.value]
        files.append(scalars)
    return files
