//! The rows of `classify --format json` (the `memgaze.classify.v1`
//! document, docs/CLI.md): one per function, one per load, and the
//! summary.
//!
//! The document itself (`schema`, `binary`, `kind`, `discovery`,
//! `has_lines`, `summary`, `functions`, `loads`, in that order) is written
//! row by row by `cargo-memgaze`, so that a large binary's loads never sit
//! in memory at once. Within each row the keys are in lexicographic order,
//! the order the fields are declared in. Addresses are `"0x…"` strings.

use crate::model::LoadClass;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Schema tag of the `classify --format json` document.
pub const CLASSIFY_SCHEMA: &str = "memgaze.classify.v1";

/// Totals over the functions analysed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Constant loads.
    #[serde(rename = "Constant")]
    pub constant: usize,
    /// Irregular loads.
    #[serde(rename = "Irregular")]
    pub irregular: usize,
    /// Strided loads.
    #[serde(rename = "Strided")]
    pub strided: usize,
    /// All explicit loads / instrumented loads (1 when none is
    /// instrumented).
    pub compression_ratio: f64,
    /// Functions analysed.
    pub functions: usize,
    /// Loads carrying a probe.
    pub instrumented: usize,
    /// Jump tables resolved.
    pub jump_tables: usize,
    /// Explicit loads.
    pub loads: usize,
    /// Loads per reason kind (why a load got its class).
    pub reasons: BTreeMap<String, usize>,
    /// Implicit stack reads (`pop`, `ret`, `leave`), never instrumented.
    pub stack_loads: usize,
    /// Implicit string reads (`movs`, `lods`, …), never instrumented.
    pub string_loads: usize,
    /// Thread-local (`fs`/`gs`) loads.
    pub tls: usize,
    /// Indirect jumps whose targets were not found.
    pub unresolved_indirect_jumps: usize,
}

/// One function of the binary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionRow {
    /// Basic blocks.
    pub blocks: u32,
    /// Its loads / its instrumented loads (1 when none is instrumented).
    pub compression_ratio: f64,
    /// Loads carrying a probe.
    pub instrumented: usize,
    /// Jump tables resolved.
    pub jump_tables: u32,
    /// Its explicit loads by class.
    pub loads: LoadCounts,
    /// Loops.
    pub loops: u32,
    /// Demangled name, or `sub_<hex start>` when unnamed.
    pub name: String,
    /// Mangled/raw symbol name when it differs from `name`.
    pub raw_name: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Where the function was found (`symtab`, `dynsym`, `eh_frame`, …).
    pub source: String,
    /// Implicit stack reads, never instrumented.
    pub stack_loads: u32,
    /// First address.
    #[serde(with = "crate::analysis::hex")]
    pub start: u64,
    /// Implicit string reads, never instrumented.
    pub string_loads: u32,
    /// Indirect jumps whose targets were not found.
    pub unresolved_indirect_jumps: u32,
}

/// A function's explicit loads by class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadCounts {
    /// Constant loads.
    #[serde(rename = "Constant")]
    pub constant: usize,
    /// Irregular loads.
    #[serde(rename = "Irregular")]
    pub irregular: usize,
    /// Strided loads.
    #[serde(rename = "Strided")]
    pub strided: usize,
    /// All of them.
    pub total: usize,
}

/// One explicit load, with why it got its class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadRow {
    /// Base register (lower case, e.g. `rdi`), if any.
    pub base: Option<String>,
    /// Its class.
    pub class: LoadClass,
    /// Displacement literal.
    pub displacement: i64,
    /// Containing function.
    pub function: String,
    /// A gather (VSIB): `index` names a vector register.
    pub gather: bool,
    /// Not instrumented: its count is implied by a proxy (or it is left
    /// out).
    pub implied: bool,
    /// Constant loads its probe stands for besides itself.
    pub implies: u32,
    /// Index register, if any.
    pub index: Option<String>,
    /// The instruction, Intel syntax.
    pub instruction: String,
    /// Whether it carries a probe.
    pub instrumented: bool,
    /// Address of the load.
    #[serde(with = "crate::analysis::hex")]
    pub ip: u64,
    /// `file:line`, when debug info exists.
    pub line: Option<String>,
    /// Loops around it.
    pub loop_depth: u32,
    /// For an uninstrumented Constant load: the address of the probe that
    /// implies it.
    #[serde(with = "crate::analysis::hex_option")]
    pub proxy: Option<u64>,
    /// The instruction also writes the location (`add [mem], reg`).
    pub read_modify_write: bool,
    /// Why it got its class.
    pub reason: String,
    /// Scale applied to the index (1, 2, 4 or 8).
    pub scale: u8,
    /// `fs`/`gs` for thread-local loads.
    pub segment: Option<String>,
    /// Bytes read.
    pub size: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The exact JSON, which is also what the old `json!` rows printed
    /// (a `serde_json::Value` sorts its keys).
    #[test]
    fn rows_keep_their_json() {
        let load = LoadRow {
            base: Some("rdi".into()),
            class: LoadClass::Strided,
            displacement: -16,
            function: "f".into(),
            gather: false,
            implied: false,
            implies: 2,
            index: None,
            instruction: "mov rax, [rdi-0x10]".into(),
            instrumented: true,
            ip: 0x1004,
            line: Some("a.c:3".into()),
            loop_depth: 1,
            proxy: None,
            read_modify_write: false,
            reason: "induction rdi".into(),
            scale: 1,
            segment: None,
            size: 8,
        };
        let old = json!({
            "ip": "0x1004", "class": "Strided", "function": "f", "line": "a.c:3",
            "instrumented": true, "implied": false, "implies": 2, "proxy": None::<String>,
            "instruction": "mov rax, [rdi-0x10]", "reason": "induction rdi",
            "base": "rdi", "index": None::<String>, "scale": 1, "displacement": -16,
            "size": 8, "segment": None::<String>, "gather": false,
            "read_modify_write": false, "loop_depth": 1,
        });
        let text = serde_json::to_string(&load).unwrap();
        assert_eq!(text, old.to_string());
        assert_eq!(
            text,
            r#"{"base":"rdi","class":"Strided","displacement":-16,"function":"f","gather":false,"implied":false,"implies":2,"index":null,"instruction":"mov rax, [rdi-0x10]","instrumented":true,"ip":"0x1004","line":"a.c:3","loop_depth":1,"proxy":null,"read_modify_write":false,"reason":"induction rdi","scale":1,"segment":null,"size":8}"#
        );
        let implied = LoadRow {
            proxy: Some(0x1000),
            ..load.clone()
        };
        let text = serde_json::to_string(&implied).unwrap();
        assert!(text.contains(r#""proxy":"0x1000""#), "{text}");
        assert_eq!(serde_json::from_str::<LoadRow>(&text).unwrap(), implied);

        let function = FunctionRow {
            blocks: 3,
            compression_ratio: 1.5,
            instrumented: 2,
            jump_tables: 0,
            loads: LoadCounts {
                constant: 1,
                irregular: 0,
                strided: 2,
                total: 3,
            },
            loops: 1,
            name: "f".into(),
            raw_name: None,
            size: 16,
            source: "symtab".into(),
            stack_loads: 1,
            start: 0x1000,
            string_loads: 0,
            unresolved_indirect_jumps: 0,
        };
        let old = json!({
            "name": "f", "raw_name": None::<String>, "start": "0x1000", "size": 16,
            "source": "symtab",
            "loads": json!({"Strided": 2, "Irregular": 0, "Constant": 1, "total": 3}),
            "instrumented": 2, "compression_ratio": 1.5, "blocks": 3, "loops": 1,
            "jump_tables": 0, "unresolved_indirect_jumps": 0, "stack_loads": 1,
            "string_loads": 0,
        });
        let text = serde_json::to_string_pretty(&function).unwrap();
        assert_eq!(text, serde_json::to_string_pretty(&old).unwrap());
        assert_eq!(
            serde_json::to_string(&function).unwrap(),
            r#"{"blocks":3,"compression_ratio":1.5,"instrumented":2,"jump_tables":0,"loads":{"Constant":1,"Irregular":0,"Strided":2,"total":3},"loops":1,"name":"f","raw_name":null,"size":16,"source":"symtab","stack_loads":1,"start":"0x1000","string_loads":0,"unresolved_indirect_jumps":0}"#
        );

        let summary = Summary {
            constant: 1,
            irregular: 0,
            strided: 2,
            compression_ratio: 1.5,
            functions: 1,
            instrumented: 2,
            jump_tables: 0,
            loads: 3,
            reasons: [("induction".to_string(), 2), ("frame".to_string(), 1)].into(),
            stack_loads: 1,
            string_loads: 0,
            tls: 0,
            unresolved_indirect_jumps: 0,
        };
        let old = json!({
            "functions": 1, "loads": 3, "Strided": 2, "Irregular": 0, "Constant": 1,
            "instrumented": 2, "compression_ratio": 1.5, "tls": 0, "stack_loads": 1,
            "string_loads": 0, "jump_tables": 0, "unresolved_indirect_jumps": 0,
            "reasons": {"induction": 2, "frame": 1},
        });
        let text = serde_json::to_string_pretty(&summary).unwrap();
        assert_eq!(text, serde_json::to_string_pretty(&old).unwrap());
        assert_eq!(
            serde_json::to_string(&summary).unwrap(),
            r#"{"Constant":1,"Irregular":0,"Strided":2,"compression_ratio":1.5,"functions":1,"instrumented":2,"jump_tables":0,"loads":3,"reasons":{"frame":1,"induction":2},"stack_loads":1,"string_loads":0,"tls":0,"unresolved_indirect_jumps":0}"#
        );
    }
}
