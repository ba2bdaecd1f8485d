"""The measures of a ranked list against judgments, their statistics, and TREC export."""
