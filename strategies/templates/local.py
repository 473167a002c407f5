# ---------------------------------------------------------------------------------------------
# One process: the collectives the shared helpers use are the identity (no process group exists).
# ---------------------------------------------------------------------------------------------
def all_reduce_sum(t) -> None:
    """One process: the sum over ranks is the value itself."""


def barrier() -> None:
    """One process: nothing to wait for."""


def gather_objects(obj, world_size: int) -> list:
    """One process: its own figures."""
    return [obj]


