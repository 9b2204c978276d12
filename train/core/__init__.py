"""The trainer itself: config, model, sharding, optimizer, step, session, the training loop
(fit), evaluation, metrics, memory estimates, run directories, and the errors and exit codes
of the command lines."""
