"""ParallelDims: the one object that owns the layout's degrees and builds every device mesh."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from contract import ParallelLayout
from worker.errors import DoNotRetryError

# Outermost to innermost. tp innermost so tensor-parallel peers are adjacent ranks, which the
# scheduler places on one node (NVLink); then cp, whose all-gathers are the next heaviest
# traffic; then pipeline stages (point-to-point sends of one activation); dp outermost, so
# its once-per-step gradient reduction is what crosses the most switches.
MESH_ORDER = ("dp", "pp", "cp", "tp")


@dataclass
class ParallelDims:
    """Degrees of each parallel dimension; their product is the world size."""

    dp: int
    tp: int
    pp: int
    cp: int
    world_size: int
    _meshes: dict[str, DeviceMesh] = field(default_factory=dict, repr=False)

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
        """Every named dim in MESH_ORDER, degree-1 ones included: a size-1 dim costs one
        trivial group, and keeping it lets every caller ask for any dim by name."""
        degrees = {"dp": self.dp, "pp": self.pp, "cp": self.cp, "tp": self.tp}
        return {name: degrees[name] for name in MESH_ORDER}

    @property
    def batch_degree(self) -> int:
        """Ranks holding different tokens of a step (dp x cp): gradients average over them."""
        return self.dp * self.cp

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The world mesh over the default process group, plus its 1-D sub-meshes, kept in
        `meshes`: one per dim, and `dp_cp` flattened from dp and cp, the group that data
        parallel reduces gradients over (context-parallel ranks hold the same weights but
        different tokens). A collective: every rank calls it, in the same order."""
        dims = self.mesh_dims
        world = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
        self._meshes = {name: world[name] for name in dims}
        # Kept here rather than sliced from `world` again later: torch deprecates slicing a
        # flattened dim out of the root mesh.
        self._meshes["dp_cp"] = world["dp", "cp"]._flatten("dp_cp")
        self._meshes["world"] = world
        return world

    def mesh(self, name: str) -> DeviceMesh:
        """The sub-mesh `name` ("dp", "pp", "cp", "tp", "dp_cp" or "world")."""
        if not self._meshes:
            raise RuntimeError("ParallelDims.build_mesh() must run first")
        return self._meshes[name]

    def describe_coordinates(self) -> str:
        """This rank's place in the mesh it built, one line for its log: `mesh: rank R of W:
        dp i/n tp j/n pp k/n cp l/n` (each index 0-based, of its degree). Read back from
        each rank's log, it shows the layout the ranks actually built, not the one asked for
        (tests/integration/test_parallel_layouts.py)."""
        world = self.mesh("world")
        at = dict(zip(MESH_ORDER, world.get_coordinate() or (), strict=True))
        degrees = self.mesh_dims
        where = " ".join(f"{dim} {at[dim]}/{degrees[dim]}" for dim in ("dp", "tp", "pp", "cp"))
        return f"mesh: rank {world.get_rank()} of {self.world_size}: {where}"
