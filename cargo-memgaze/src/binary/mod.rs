//! Reading x86-64 ELF executables: functions, symbols, source lines,
//! decoded instructions and control flow.
