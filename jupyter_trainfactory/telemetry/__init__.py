"""Pure telemetry: host and GPU readers and derived numbers (no Ray, MLflow or GPU needed)."""
