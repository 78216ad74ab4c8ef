"""Multi-LoRA serving: PEFT adapters parsed off the step path, device slots, per-step batched deltas."""
