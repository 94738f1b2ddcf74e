"""Training loop, optimizer and schedules, precision, parallelize, checkpoint, loggers."""
