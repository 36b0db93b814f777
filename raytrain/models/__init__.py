"""Models raytrain trains out of the box, and the loader for a user's own by import path."""
