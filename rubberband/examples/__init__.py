"""Small real example jobs that run on this machine's CPU."""
