"""How long NCCL collectives and point-to-point transfers take on NVLink and the NICs.

Ranks are numbered tp fastest, then cp, then dp, then pp (Megatron's default order), so
a group whose members are `stride` ranks apart has min(size, gpus_per_node / stride)
members in each node. Collectives are modelled hierarchically, as NCCL's NVLS/tree
algorithms run them: the NVLink phase and the NIC phase stream concurrently, so the
slower of the two sets the time; with g members per node the NIC phase moves 1/g of the
data through each GPU's NIC (Thakur et al. 2005 ring costs, applied per level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import (
    NIC_EFFICIENCY,
    NIC_HOP_LATENCY_S,
    NVLINK_EFFICIENCY,
    NVLINK_HOP_LATENCY_S,
    Hardware,
    Network,
)


@dataclass(frozen=True, slots=True)
class Fabric:
    """Effective link rates for one plan: NCCL bus bandwidth, not the datasheet figure."""

    nvlink_bytes_per_s: float  # one way, per GPU
    nic_bytes_per_s: float  # per GPU
    gpus_per_node: int

    @classmethod
    def of(cls, hardware: Hardware, network: Network, gpus_per_node: int) -> Fabric:
        return cls(
            # The vendor's NVLink figure counts both directions; a ring uses one.
            nvlink_bytes_per_s=hardware.nvlink_bytes_per_s / 2 * NVLINK_EFFICIENCY,
            nic_bytes_per_s=hardware.nic_bytes_per_s_per_gpu(network, gpus_per_node)
            * NIC_EFFICIENCY,
            gpus_per_node=gpus_per_node,
        )

    def span(self, size: int, stride: int) -> tuple[int, int]:
        """(members per node, nodes spanned) of a group of `size` ranks `stride` apart."""
        per_node = max(1, min(size, self.gpus_per_node // stride))
        return per_node, size // per_node

    def collective_s(self, num_bytes: float, size: int, stride: int, passes: int) -> float:
        """Time of one collective over `num_bytes` (the full, unsharded buffer).

        passes: 1 for all-gather or reduce-scatter, 2 for all-reduce (a reduce-scatter
        followed by an all-gather).
        """
        if size <= 1 or num_bytes <= 0:
            return 0.0
        per_node, nodes = self.span(size, stride)
        intra = passes * (per_node - 1) / per_node * num_bytes / self.nvlink_bytes_per_s
        inter = 0.0
        latency = passes * (per_node - 1) * NVLINK_HOP_LATENCY_S
        if nodes > 1:
            inter = passes * (nodes - 1) / nodes * num_bytes / (per_node * self.nic_bytes_per_s)
            # NCCL runs all-gather and reduce-scatter as rings (its Tree algorithm is for
            # all-reduce only: NCCL docs, NCCL_ALGO), so a ring's message crosses every
            # node in turn; an all-reduce's tree needs only log2(nodes) steps.
            hops = nodes - 1 if passes == 1 else math.ceil(math.log2(nodes))
            latency += passes * hops * NIC_HOP_LATENCY_S
        return max(intra, inter) + latency

    def p2p_s(self, num_bytes: float, stride: int) -> float:
        """One send to the rank `stride` away (inside the node if it fits there)."""
        if stride < self.gpus_per_node:
            return num_bytes / self.nvlink_bytes_per_s + NVLINK_HOP_LATENCY_S
        return num_bytes / self.nic_bytes_per_s + NIC_HOP_LATENCY_S
