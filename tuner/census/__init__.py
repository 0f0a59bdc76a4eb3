"""The census: a trace read into seats with their shapes and needs (`census`), and a
seat's status derived from its records (`status`)."""
