"""gpucert's own Triton kernels: the fused loss's softmax - one_hot (cross_entropy.py), the fused MLP's backward
(swiglu.py) and FP8's fused MLP between its GEMMs (swiglu_fp8.py). Each has a fallback off CUDA, and tests/finetune
runs each in Triton's interpreter."""
