"""Building the golden set: query-log sampling, generated questions, judgments from the labelling page,
candidate pools and the audit."""
