//! The torture test: real processes, injected faults, a recorded history
//! and an independent checker (see docs/reliability.md).

pub mod checker;
