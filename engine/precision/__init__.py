"""Numeric precision: mixed precision (autocast, the fp16 grad scaler), fp8 through torchao, and whether
the CPU computes bf16 natively."""
