"""One dispatch registry per op: name -> implementation, with an ordered default.

    registry = Registry("fpa_attention", default_order=("pallas", "xla"), entries=(
        Entry("xla", fpa_xla),                                 # runs everywhere
        Entry("pallas", fpa_pallas, supports=pallas_supports)))
    name, fn = registry.select(implementation, **facts)        # facts: what `supports` reads

A registry is immutable: its table is built once, in the op's module, from the backends that
module imports (nothing registers by being imported); `with_default_order` gives a copy that
tries its entries in another order.

`supports(**facts)` returns None when the entry can run on those inputs (platform, dtype, head
dim, ...) and otherwise a short reason. `select(None, ...)` walks `default_order` and returns
the first entry that supports the inputs; entries left out of the order (the dense
"reference" oracles) and entries registered `explicit_only` are never chosen by default. An explicit name that cannot run raises
`UnsupportedImplementationError` with the entry's reason; an unknown name raises ValueError
listing the known ones. `check_name` is the load-time check the trainer's config uses.

Platform facts shared by every op live here too (`platform_facts`), so each op asks the same
question the same way.
"""

import dataclasses
from types import MappingProxyType
from typing import Callable, Iterable, Optional

import jax

Supports = Callable[..., Optional[str]]


class UnsupportedImplementationError(ValueError):
    """An explicitly requested implementation cannot run on the given inputs."""


def always(**_facts):
    """`supports` of an entry that runs on every input its op accepts."""
    return None


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable
    supports: Supports = always
    explicit_only: Optional[str] = None  # why the default must not pick it (None: it may)


class Registry:
    """The implementations of one op (read-only), in the order the default tries them.
    `explicit_only` on an entry: a reason to keep the default from choosing it (for example a
    kernel not yet validated on hardware); it still runs when named."""

    def __init__(self, op_name: str, default_order: tuple[str, ...], entries: Iterable[Entry]):
        table: dict[str, Entry] = {}
        for entry in entries:
            if entry.name in table:
                raise ValueError(f"{op_name}: implementation {entry.name!r} is listed twice")
            table[entry.name] = entry
        self._op_name, self._default_order = op_name, tuple(default_order)
        self._entries = MappingProxyType(table)

    @property
    def op_name(self) -> str:
        return self._op_name

    @property
    def default_order(self) -> tuple[str, ...]:
        return self._default_order

    def with_default_order(self, default_order: tuple[str, ...]) -> "Registry":
        """A copy with the same entries, tried by default in `default_order`."""
        return Registry(self.op_name, default_order, self._entries.values())

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def check_name(self, implementation: Optional[str]) -> None:
        """Raise ValueError unless `implementation` is None or a registered name."""
        if implementation is not None and implementation not in self._entries:
            raise ValueError(
                f"implementation: {self.op_name} has no implementation {implementation!r}; "
                f"expected None or one of {self.names()}")

    def reason_unsupported(self, implementation: str, **facts) -> Optional[str]:
        """None if the named entry runs on these inputs, else why not."""
        self.check_name(implementation)
        return self._entries[implementation].supports(**facts)

    def select(self, implementation: Optional[str], **facts) -> tuple[str, Callable]:
        """(name, fn) of the entry to run: the named one, or the first default that fits."""
        if implementation is not None:
            reason = self.reason_unsupported(implementation, **facts)
            if reason is not None:
                raise UnsupportedImplementationError(
                    f"implementation: {self.op_name} cannot run {implementation!r} here: "
                    f"{reason}")
            return implementation, self._entries[implementation].fn
        reasons = []
        for name in self.default_order:
            entry = self._entries.get(name)
            if entry is None:
                continue
            reason = entry.explicit_only or entry.supports(**facts)
            if reason is None:
                return name, entry.fn
            reasons.append(f"{name}: {reason}")
        raise UnsupportedImplementationError(
            f"implementation: no default implementation of {self.op_name} supports these "
            f"inputs ({'; '.join(reasons) or 'none registered'})")


def platform_facts() -> dict:
    """Facts about the default device that `supports` functions read.

    platform: "cpu" | "gpu" | "tpu"; compute_capability: e.g. "9.0" on Hopper, else None.
    """
    device = jax.devices()[0]
    return {"platform": device.platform,
            "compute_capability": getattr(device, "compute_capability", None)}


def is_hopper(facts: dict) -> bool:
    return facts.get("platform") == "gpu" and str(facts.get("compute_capability")) == "9.0"


def mosaic_gpu_reason(facts: dict, operands: str = "inputs") -> Optional[str]:
    """None if a Mosaic GPU kernel can take these inputs: on a Hopper GPU with 16-bit (bf16,
    fp16) `operands`, or in the GPU interpreter (mixer_core.interpret), which also takes
    float32; else why not. The kernels' `supports` add their own shape conditions."""
    from mixer_core.interpret import interpret_active  # imports Pallas: not at start-up
    interpreting = interpret_active()
    if not (is_hopper(facts) or interpreting):
        return (f"needs a Hopper GPU (compute capability 9.0), got platform "
                f"{facts.get('platform')} (compute capability {facts.get('compute_capability')})")
    dtype = jax.numpy.dtype(facts.get("dtype", "float32"))
    if dtype.name not in ("bfloat16", "float16") and not (interpreting and dtype.name == "float32"):
        return f"needs bf16 or fp16 {operands}, got {dtype}"
    return None
