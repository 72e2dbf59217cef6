"""mismatch_ctrl."""
