//! GRPO: Group Relative Policy Optimization and its relatives.

pub mod algo;
