"""The learner's policy: GRPO with step-level credit (ADCA, ADPO), hindsight from the next turn, LoRA, the
step size, which judged groups a step uses, the model and optimizer step, and the learner's checkpoints."""
