"""gpucert's own Triton kernels: the fused loss's softmax - one_hot (cross_entropy.py) and the fused MLP's backward
(swiglu.py). Each has a fallback off CUDA, and tests/finetune runs each in Triton's interpreter."""
