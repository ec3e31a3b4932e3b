"""Hand-written TIR schedules per target."""
