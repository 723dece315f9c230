"""Whether the programs of one interpreted launch touched each other's memory.

The grader finds write races by running a call again with its kernel's programs visited in reverse
(run_call.py). That doubles the cost of every graded call, and for most calls it cannot find anything:
when no byte a program stores is stored or loaded by another program of the same launch, every program
reads what was there before the launch and every byte ends as its one writer left it, in any order.
So the interpreter's loads and stores are logged here, program by program, and the reverse run is made
only for the calls whose launches overlap. An atomic is taken as an overlap: atomics exist for programs
that share memory, and the reverse run decides whether the result depends on the order.
"""

from __future__ import annotations


def _bytes(addresses, size: int):
    """Every byte address that elements of `size` bytes starting at `addresses` cover: [n * size] uint64."""
    import numpy as np

    if size == 1:
        return addresses
    return (addresses[:, None] + np.arange(size, dtype=np.uint64)[None, :]).ravel()


class AccessLog:
    """The active lanes of one launch's loads and stores, with the program that made each."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.stores: list = []  # (first byte of each element [n] uint64, element size, program)
        self.loads: list = []  # (the same, the lowest address, the highest address)
        self.shared = False  # an atomic, or an access the log could not see

    def record(self, what: str, addresses, size: int, program: int) -> None:
        """addresses: the first byte of each active lane's element ([n] uint64)."""
        if addresses.size == 0:
            return
        if what == "store":
            self.stores.append((addresses, size, program))
        elif what == "load":
            self.loads.append((addresses, size, program, int(addresses.min()), int(addresses.max())))
        else:
            self.shared = True

    def overlapping(self) -> bool:
        """Some byte stored by one program is stored or loaded by another program of the launch."""
        import numpy as np

        if self.shared:
            return True
        if not self.stores:
            return False
        written = np.concatenate([_bytes(a, size) for a, size, _ in self.stores])  # [bytes] uint64
        writer = np.concatenate(
            [np.full(a.size * size, program, dtype=np.int64) for a, size, program in self.stores]
        )
        order = np.lexsort((writer, written))
        written, writer = written[order], writer[order]
        repeat = np.zeros(written.size, dtype=bool)
        repeat[1:] = (written[1:] == written[:-1]) & (writer[1:] == writer[:-1])
        written, writer = written[~repeat], writer[~repeat]  # each (byte, program) once
        if (written[1:] == written[:-1]).any():
            return True  # a byte two programs store
        first, last = int(written[0]), int(written[-1])
        for addresses, size, program, low, high in self.loads:
            if high + size <= first or low > last:
                continue  # this load read none of the bytes stored
            read = _bytes(addresses, size)
            at = np.minimum(np.searchsorted(written, read), written.size - 1)
            hit = written[at] == read
            if (writer[at[hit]] != program).any():
                return True  # a byte one program stores and another loads
        return False


def program_number(grid_idx, grid_dim) -> int:
    """One number for a program of the grid, from its (x, y, z) index and the grid's extents."""
    x, y, z = grid_idx
    nx, ny, _ = grid_dim
    return int(x) + int(nx) * (int(y) + int(ny) * int(z))
