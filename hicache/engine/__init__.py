"""Reference engine pieces that embed hicache (today: the tiny DeepSeek-V4-style model)."""
