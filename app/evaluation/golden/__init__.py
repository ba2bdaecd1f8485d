"""The golden set: its cases and their rules, BEIR import, and the audit."""
