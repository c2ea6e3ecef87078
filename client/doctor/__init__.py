"""`runyard doctor`: is this site ready for runyard? Each check says what is wrong and the fix."""
