"""Hardware discovery: collect from the system, parse into typed records (pure), no judging here."""
