"""Database backends of our own (only where Django's need a change for how we use them)."""
