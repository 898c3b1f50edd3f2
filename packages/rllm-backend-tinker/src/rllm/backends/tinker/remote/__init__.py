"""The remote service: the Tinker API through the official ``tinker`` SDK."""
