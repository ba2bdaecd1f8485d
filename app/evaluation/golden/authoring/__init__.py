"""Authoring the golden set: query-log sampling, generated questions, judgments from the labelling page and
candidate pools."""
