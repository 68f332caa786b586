"""The model side of fine-tuning: the base model with LoRA adapters and its loss (lora.py), and what makes a step
fast: the fused head and loss (loss.py), fused projections with the adapters inside the frozen GEMMs (fused.py,
in_gemm.py), FP8 frozen weights (fp8.py) and FP8's MLP as one function (fp8_mlp.py), FlashAttention-3 and torch's
varlen attention (flash.py), and the Triton kernels (kernels/). Which of them a run uses is decided once, in
finetune/plan.py."""
