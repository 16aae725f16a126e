"""A loopback all-gather for tests: a hub thread in the test process (a rendezvous server, as
torch.distributed's TCPStore is) and a client per rank process, over TCP on 127.0.0.1.

Each rank sends ``(rank, obj)``; once every rank has sent, the hub answers each with the list
of every rank's object in rank order. Nothing leaves the machine; the hub stops after one
round, or when its deadline passes.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Callable, List, Optional, Tuple

Address = Tuple[str, int]


class Hub:
    """One all-gather round for ``world`` ranks, served from a thread."""

    def __init__(self, world: int, deadline_s: float = 120.0) -> None:
        self.world = world
        self.authkey = b"memplan-test"
        self._listener = Listener(("127.0.0.1", 0), authkey=self.authkey)
        self.address: Address = self._listener.address
        self.error: Optional[BaseException] = None
        self._deadline_s = deadline_s
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conns: List[Connection] = []
        try:
            got: List[Any] = [None] * self.world
            for _ in range(self.world):
                c = self._listener.accept()
                conns.append(c)
                if not c.poll(self._deadline_s):
                    raise TimeoutError("a rank connected but sent nothing")
                rank, obj = c.recv()
                got[rank] = obj
            for c in conns:
                c.send(got)
        except BaseException as e:  # reported to the test by join()
            self.error = e
        finally:
            for c in conns:
                c.close()
            self._listener.close()

    def close(self) -> None:
        """Stop waiting for ranks (one failed before it sent its object)."""
        self._listener.close()

    def join(self, timeout: float = 120.0) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._listener.close()
            raise TimeoutError("the all-gather hub did not finish")
        if self.error is not None:
            raise self.error


def all_gather(address: Address, authkey: bytes, rank: int) -> Callable[[Any], List[Any]]:
    """The rank's all-gather, MPI style: ``f(obj) -> [every rank's obj]``."""

    def gather(obj: Any) -> List[Any]:
        with Client(address, authkey=authkey) as c:
            c.send((rank, obj))
            if not c.poll(120.0):
                raise TimeoutError("the all-gather hub did not answer")
            out: List[Any] = c.recv()
            return out

    return gather


def torch_style(gather: Callable[[Any], List[Any]]) -> Callable[[List[Any], Any], None]:
    """The same all-gather with ``torch.distributed.all_gather_object``'s shape:
    ``f(output_list, obj)`` fills ``output_list``."""

    def all_gather_object(output: List[Any], obj: Any) -> None:
        output[:] = gather(obj)

    return all_gather_object
