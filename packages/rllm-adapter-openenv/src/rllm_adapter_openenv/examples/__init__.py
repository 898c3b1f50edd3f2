"""OpenEnv environments shipped with the adapter: the CI's training runs, and templates."""
