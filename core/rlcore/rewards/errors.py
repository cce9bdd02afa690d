"""Errors of the reward layer."""


class RewardError(RuntimeError):
    """Scoring failed; the message names the sample (or file, or data source) and says what to do."""
