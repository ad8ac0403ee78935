"""Baselines for motion magnitude, used by tests and bench only (not shipped).

``seed_style_flow`` is the public StreamChat reference approach: unfold every
w x w window and call ``torch.linalg.solve`` per pixel.  It is kept here (with
the seed's two bugs fixed: v is used, pixels with an ill-conditioned window are
left out) as an independent oracle for the closed-form solve and as the
"before" number in the benchmark.
"""
import torch
import torch.nn.functional as F

from streammem_kernels.motion.reference import structure_products


def seed_style_flow(gray: torch.Tensor, window: int = 5, min_eig: float = 1e-5) -> torch.Tensor:
    """(T, H, W) gray in [0, 1] or uint8 -> (T-1,) mean flow magnitude, via unfold + linalg.solve."""
    prods = structure_products(gray)  # (P, 5, Hg, Wg): same gradients as the kernels
    pairs = prods.shape[0]
    flows = []
    for p in range(pairs):
        # Each window's products, summed: (5, Ho*Wo); the seed unfolds Ix, Iy, It.
        cols = F.unfold(prods[p : p + 1], kernel_size=window)  # (1, 5*w*w, L)
        sums = cols.view(5, window * window, -1).sum(1) / (window * window)
        a, b, c, bx, by = sums
        ata = torch.stack((torch.stack((a, b), -1), torch.stack((b, c), -1)), -2)  # (L, 2, 2)
        rhs = -torch.stack((bx, by), -1)
        eig = torch.linalg.eigvalsh(ata)[:, 0]
        valid = eig > min_eig
        uv = torch.zeros_like(rhs)
        if valid.any():
            uv[valid] = torch.linalg.solve(ata[valid], rhs[valid].unsqueeze(-1)).squeeze(-1)
        mag = uv.norm(dim=-1)
        flows.append(mag[valid].mean() if valid.any() else mag.new_zeros(()))
    return torch.stack(flows)
