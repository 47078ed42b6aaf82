"""What the two chat bots share: who may ask and how often (``access``), and the rest they have in common."""
