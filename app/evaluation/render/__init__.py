"""The report rendered: Markdown, HTML, and the tuning report."""
