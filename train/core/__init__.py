"""The trainer itself: config, model, sharding, optimizer, step, session, the training loop
(fit), evaluation, metrics, memory estimates and run directories."""
