"""ParallelDims: the one object that owns the layout's degrees and builds the device mesh."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from worker.config import ParallelLayout
from worker.errors import DoNotRetryError

# Outermost to innermost. tp last so tensor-parallel peers are adjacent ranks, which the
# scheduler places on one node (NVLink); pp first so pipeline stages span nodes.
MESH_ORDER = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of each parallel dimension; their product is the world size."""

    dp: int
    tp: int
    pp: int
    cp: int
    world_size: int

    def __post_init__(self) -> None:
        product = self.dp * self.tp * self.pp * self.cp
        if product != self.world_size:
            raise DoNotRetryError(
                f"layout dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp} = {product} "
                f"ranks, but {self.world_size} were launched"
            )

    @classmethod
    def from_layout(cls, layout: ParallelLayout, world_size: int) -> ParallelDims:
        return cls(dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp, world_size=world_size)

    @property
    def mesh_dims(self) -> dict[str, int]:
        """Named dims in MESH_ORDER; dims of degree 1 are left out (each costs process
        groups at init), except dp, which the data loader and DDP always ask for."""
        degrees = {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}
        return {name: degrees[name] for name in MESH_ORDER if degrees[name] > 1 or name == "dp"}

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The device mesh over the default process group (a collective: every rank calls)."""
        dims = self.mesh_dims
        return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
