"""Bad arguments to ddl.dist raise clear exceptions. Run alone (a one-rank job).

Each case calls a function with a bad argument (or after the shutdown that interpreter exit
runs) and checks the exception's type and that its message names the offending value. Prints ``dist_errors ok cases=N`` on success.
"""

from __future__ import annotations

import re
from typing import Callable, Type

import torch

import ddl
import ddl.dist as dd
from _job import say

CASES = 0


def raises(exc: Type[BaseException], pattern: str, fn: Callable[[], object], what: str) -> None:
    """Asserts that ``fn()`` raises ``exc`` with a message matching ``pattern``."""
    global CASES
    try:
        fn()
    except exc as e:
        assert re.search(pattern, str(e)), f"{what}: message {str(e)!r} lacks {pattern!r}"
        CASES += 1
        return
    except BaseException as e:
        raise AssertionError(f"{what}: raised {type(e).__name__}: {e}, want {exc.__name__}")
    raise AssertionError(f"{what}: raised nothing, want {exc.__name__}")


def main() -> None:
    t = torch.ones(4)
    init_hint = r"init\(\)"
    # Before init(): every entry point says to call init().
    raises(RuntimeError, init_hint, dd.rank, "rank() before init")
    raises(RuntimeError, init_hint, dd.size, "size() before init")
    raises(RuntimeError, init_hint, dd.barrier, "barrier() before init")
    raises(RuntimeError, init_hint, lambda: dd.allreduce_(t), "allreduce_ before init")
    raises(RuntimeError, init_hint, lambda: dd.allreduce_async_(t), "allreduce_async_ before init")
    raises(RuntimeError, init_hint, lambda: dd.broadcast_(t), "broadcast_ before init")
    model = torch.nn.Linear(3, 2)
    raises(RuntimeError, init_hint, lambda: dd.broadcast_parameters(model),
           "broadcast_parameters before init")
    raises(RuntimeError, init_hint, lambda: dd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model), "DistributedOptimizer before init")
    raises(ValueError, r"timeout.*-1", lambda: dd.init(timeout=-1), "init(timeout=-1)")
    assert not dd.is_initialized(), "a rejected init() left ddl.dist initialised"

    dd.init(timeout=10)
    assert dd.size() == 1
    for dtype in (torch.int64, torch.int32, torch.float64, torch.bool):
        bad = torch.zeros(5, dtype=dtype)
        raises(TypeError, re.escape(str(dtype)), lambda: dd.allreduce_(bad),
               f"allreduce_ of {dtype}")
        raises(TypeError, re.escape(str(dtype)), lambda: dd.allreduce_async_(bad),
               f"allreduce_async_ of {dtype}")
    raises(TypeError, "list", lambda: dd.allreduce_([1.0, 2.0]), "allreduce_ of a list")
    for name in ("bogus", "Ring ", "multicolor:x", "multiring:5x7", ""):
        raises(ValueError, re.escape(name) if name else "algorithm: ''",
               lambda: dd.allreduce_(t, algorithm=name), f"algorithm {name!r}")
    raises(ValueError, "bogus", lambda: dd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model, algorithm="bogus"),
        "DistributedOptimizer(algorithm='bogus')")
    for root in (1, 5, -1):
        raises(ValueError, rf"root.*{root}", lambda: dd.broadcast_(t, root=root),
               f"broadcast_ root={root}")
    raises(ValueError, "root", lambda: dd.broadcast_parameters(model, root=3),
           "broadcast_parameters root=3")
    raises(TypeError, "root", lambda: dd.broadcast_(t, root="0"), "broadcast_ root='0'")
    # The errors left ddl usable.
    x = torch.arange(6, dtype=torch.float32)
    dd.allreduce_(x, average=False)
    assert torch.equal(x, torch.arange(6, dtype=torch.float32)), "one-rank sum is not identity"
    assert isinstance(ddl.DistError(), ddl.DdlError)
    # After the shutdown that interpreter exit runs: every entry point says it was shut
    # down and cannot be used again (not "call init() first", which init() then refuses).
    dd._shutdown()
    shut = "shut down.*cannot be used or initialised again"
    raises(RuntimeError, shut, lambda: dd.allreduce_(t), "allreduce_ after shutdown")
    raises(RuntimeError, shut, lambda: dd.broadcast_(t), "broadcast_ after shutdown")
    raises(RuntimeError, shut, dd.rank, "rank() after shutdown")
    raises(RuntimeError, shut, dd.init, "init() after shutdown")
    say(f"dist_errors ok cases={CASES}")


if __name__ == "__main__":
    main()
