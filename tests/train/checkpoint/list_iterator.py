"""A stand-in for a checkpointable data iterator."""


class ListIterator:
    """Minimal checkpointable iterator with a tuple in its state (like grain's packer)."""

    def __init__(self):
        self.position = 0

    def get_state(self):
        return {"position": self.position, "slices": {"tokens": (-1, -1)}}

    def set_state(self, state):
        assert state["slices"]["tokens"] == (-1, -1)
        self.position = state["position"]
