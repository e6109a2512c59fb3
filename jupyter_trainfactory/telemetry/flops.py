"""Model FLOPs and MFU (model FLOPs utilization), with a table of accelerator peaks.

MFU = achieved model FLOP/s / peak FLOP/s of the accelerator (PaLM, Chowdhery et al. 2022,
appendix B). Model FLOPs count only the work the model needs (forward + backward), not
recomputation, so MFU is comparable across implementations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "PEAK_TFLOPS",
    "Peak",
    "flops_per_token",
    "lookup_peak",
    "mfu",
]


def flops_per_token(
    n_params: int,
    layers: int | None = None,
    heads: int | None = None,
    head_dim: int | None = None,
    seq_len: int | None = None,
) -> float:
    """Training FLOPs per token: ``6 * N`` plus ``12 * L * H * Q * T`` for attention.

    Source: PaLM (Chowdhery et al., 2022), appendix B: a forward and backward pass costs
    ``6N`` FLOPs per token for the parameter matmuls (2 forward, 4 backward) and
    ``12 * L * H * Q * T`` for self-attention (L layers, H heads, Q head dimension,
    T sequence length); torchtitan's ``get_num_flop_per_token`` uses the same formula.
    The attention term is added only when all four of L, H, Q, T are given.

    Parameters
    ----------
    n_params : int
        Trainable parameters N.
    layers, heads, head_dim, seq_len : int, optional
        L, H, Q and T.

    Returns
    -------
    float
        FLOPs per token (forward + backward).

    Raises
    ------
    ValueError
        If ``n_params`` is negative, or only some of L, H, Q, T are given, or any is < 1.
    """
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}.")
    shape = (layers, heads, head_dim, seq_len)
    given = [v is not None for v in shape]
    if any(given) and not all(given):
        raise ValueError("give all of layers, heads, head_dim and seq_len for the attention term.")
    flops = 6.0 * n_params
    if all(given):
        if min(shape) < 1:
            raise ValueError(f"layers, heads, head_dim and seq_len must be >= 1, got {shape}.")
        flops += 12.0 * layers * heads * head_dim * seq_len
    return flops


@dataclass(frozen=True)
class Peak:
    """Dense tensor-core peak of one accelerator, TFLOP/s, by data type (None: no such unit)."""

    bf16: float | None
    fp16: float | None


#: Dense (no structured sparsity) tensor-core peaks per accelerator, TFLOP/s.
#: NVIDIA data sheets quote sparse figures first; the dense figure is half of it.
PEAK_TFLOPS: dict[str, Peak] = {
    # NVIDIA B200 (HGX B200 spec, 2024): FP16/BF16 Tensor Core 36 PFLOPS per 8 GPUs with
    # sparsity -> 4.5 PFLOPS sparse, 2,250 TFLOPS dense per GPU.
    "B200": Peak(bf16=2250.0, fp16=2250.0),
    # NVIDIA H200 data sheet (2024): H200 SXM BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity.
    "H200 SXM": Peak(bf16=989.5, fp16=989.5),
    # NVIDIA H200 data sheet (2024): H200 NVL BF16/FP16 Tensor Core 1,671 TFLOPS with sparsity.
    "H200 NVL": Peak(bf16=835.5, fp16=835.5),
    # NVIDIA GH200 Grace Hopper data sheet: the same Hopper GPU as H100 SXM (1,979 sparse).
    "GH200": Peak(bf16=989.5, fp16=989.5),
    # NVIDIA H100 data sheet (2023): H100 SXM BF16/FP16 Tensor Core 1,979 TFLOPS with sparsity.
    "H100 SXM": Peak(bf16=989.5, fp16=989.5),
    # NVIDIA H100 data sheet (2023): H100 PCIe BF16/FP16 Tensor Core 1,513 TFLOPS with sparsity.
    "H100 PCIe": Peak(bf16=756.5, fp16=756.5),
    # NVIDIA H100 data sheet (2024 revision): H100 NVL 1,671 TFLOPS with sparsity.
    "H100 NVL": Peak(bf16=835.5, fp16=835.5),
    # NVIDIA A100 data sheet (2021): BF16/FP16 Tensor Core 312 TFLOPS dense (624 sparse),
    # SXM and PCIe, 40 GB and 80 GB alike.
    "A100": Peak(bf16=312.0, fp16=312.0),
    # NVIDIA L40S data sheet (2023): BF16/FP16 Tensor Core 362.05 TFLOPS dense (733 sparse).
    "L40S": Peak(bf16=362.05, fp16=362.05),
    # NVIDIA L4 data sheet (2023): BF16/FP16 Tensor Core 242 TFLOPS with sparsity -> 121 dense.
    "L4": Peak(bf16=121.0, fp16=121.0),
    # NVIDIA A10 data sheet (2021): BF16/FP16 Tensor Core 125 TFLOPS dense (250 sparse).
    "A10": Peak(bf16=125.0, fp16=125.0),
    # NVIDIA V100 data sheet (2020): Tensor Performance 125 TFLOPS (SXM2); no bf16 units.
    "V100 SXM2": Peak(bf16=None, fp16=125.0),
    # NVIDIA V100 data sheet (2020): Tensor Performance 112 TFLOPS (PCIe); no bf16 units.
    "V100 PCIe": Peak(bf16=None, fp16=112.0),
    # NVIDIA T4 data sheet (2019): Mixed Precision (FP16/FP32) 65 TFLOPS; no bf16 units.
    "T4": Peak(bf16=None, fp16=65.0),
}

# Device names as NVML or torch.cuda.get_device_name report them ("NVIDIA H100 80GB HBM3",
# "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", ...), most specific pattern first.
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p, re.IGNORECASE), key)
    for p, key in [
        (r"\bB200\b", "B200"),
        (r"\bGH200\b", "GH200"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200 SXM"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bA100\b", "A100"),
        (r"\bL40S\b", "L40S"),
        (r"\bL4\b", "L4"),
        (r"\bA10\b", "A10"),
        (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
        (r"\bV100\b", "V100 SXM2"),
        (r"\bT4\b", "T4"),
    ]
]
# A MIG instance's name ends in "MIG <g>g.<mem>gb"; it has g of the GPU's 7 compute slices
# (NVIDIA MIG user guide: A100, H100 and H200 are split into at most 7 GPU instances).
_MIG = re.compile(r"\bMIG\s+(\d)g\.", re.IGNORECASE)
_MIG_SLICES = 7


def lookup_peak(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of the accelerator called ``device_name`` for ``dtype``.

    Parameters
    ----------
    device_name : str
        As NVML's ``nvmlDeviceGetName`` or ``torch.cuda.get_device_name`` reports it.
    dtype : {"bf16", "fp16"}
        The training precision.

    Returns
    -------
    float or None
        FLOP/s (not TFLOP/s), scaled by ``g/7`` for a MIG instance with ``g`` compute
        slices; None when the device is not in :data:`PEAK_TFLOPS` (a CPU, say) or has
        no unit for ``dtype``: MFU is then unavailable, never guessed.

    Raises
    ------
    ValueError
        If ``dtype`` is not ``"bf16"`` or ``"fp16"``.
    """
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {dtype!r}.")
    name = device_name or ""
    for pattern, key in _PATTERNS:
        if pattern.search(name):
            tflops = getattr(PEAK_TFLOPS[key], dtype)
            if tflops is None:
                return None
            mig = _MIG.search(name)
            fraction = int(mig.group(1)) / _MIG_SLICES if mig else 1.0
            return tflops * 1e12 * fraction
    return None


def mfu(tokens_per_s_per_accelerator: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization, a fraction in [0, 1] for a sane measurement.

    ``MFU = tokens/s per accelerator * FLOPs per token / peak FLOP/s per accelerator``
    (PaLM, appendix B). Raises ValueError if ``peak_flops`` is not positive.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}.")
    return tokens_per_s_per_accelerator * flops_per_token / peak_flops
