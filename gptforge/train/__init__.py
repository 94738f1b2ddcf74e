"""The training loop, optimizer and schedules, parallelism, fine-tuning, loggers."""
