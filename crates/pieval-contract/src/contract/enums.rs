//! Closed vocabularies of the contract. Each is a Rust enum (for code that builds
//! cases) and a `&[&str]` list (for validation and the JSON-Schema agreement test).
//! Extend when a real case needs a new value; never rename one.

macro_rules! contract_enum {
    ($(#[$meta:meta])* $name:ident, $all:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant),+
        }

        /// Every value of the vocabulary, in contract order.
        pub const $all: &[&str] = &[$($text),+];

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

contract_enum!(
    /// Where a case comes from.
    SourceType, SOURCE_TYPES {
        PublicBenchmark = "public_benchmark",
        Synthetic = "synthetic",
        Handwritten = "handwritten",
        RedTeam = "red_team",
        InTheWild = "in_the_wild",
    }
);

contract_enum!(
    /// Where the attack text enters the application.
    AttackSurface, ATTACK_SURFACES {
        UserPrompt = "user_prompt",
        SystemPrompt = "system_prompt",
        RetrievedDocument = "retrieved_document",
        Email = "email",
        WebPage = "web_page",
        ToolOutput = "tool_output",
        CodeComment = "code_comment",
        TableCell = "table_cell",
        MultiTurn = "multi_turn",
    }
);

impl AttackSurface {
    /// Indirect surfaces carry the attack inside untrusted data (`task_input`), not in
    /// the user turn.
    pub fn is_indirect(self) -> bool {
        !matches!(
            self,
            AttackSurface::UserPrompt | AttackSurface::SystemPrompt | AttackSurface::MultiTurn
        )
    }
}

contract_enum!(
    /// `attack` cases count in attack metrics; `benign` controls measure over-refusal.
    Label, LABELS {
        Attack = "attack",
        Benign = "benign",
    }
);

contract_enum!(
    BenchmarkSplit, BENCHMARK_SPLITS {
        Dev = "dev",
        Test = "test",
        Train = "train",
    }
);

contract_enum!(
    /// Used by both `severity_level` (declared by the author) and `severity` (enriched).
    Severity, SEVERITIES {
        Critical = "critical",
        High = "high",
        Medium = "medium",
        Low = "low",
    }
);

contract_enum!(
    EvaluationMode, EVALUATION_MODES {
        Automatic = "automatic",
        Judge = "judge",
        Manual = "manual",
    }
);

contract_enum!(
    /// Enriched category, aligned with OWASP LLM01/LLM07:2025 and MITRE ATLAS AML.T0051.
    AttackCategory, ATTACK_CATEGORIES {
        DirectInjection = "direct_injection",
        IndirectInjection = "indirect_injection",
        PromptLeakage = "prompt_leakage",
        Jailbreak = "jailbreak",
        Obfuscation = "obfuscation",
        PayloadSplitting = "payload_splitting",
        DataExfiltration = "data_exfiltration",
        BenignControl = "benign_control",
    }
);

/// `success_criteria.type` values (see [`crate::contract::SuccessCriteria`]).
pub const CRITERION_TYPES: &[&str] = &[
    "contains",
    "regex",
    "canary",
    "not_refused",
    "judge",
    "any",
    "all",
    "tool_call",
    "no_tool_call",
    "sequence",
    "count",
    "not",
    "state",
];

contract_enum!(
    /// Why a case_results row is in manual review (`review_reason`, comma-separated in the
    /// file; the `review_reasons` list as every query reads it).
    ReviewReason, REVIEW_REASONS {
        UnknownCase = "unknown_case",
        DuplicatePrediction = "duplicate_prediction",
        ProviderError = "provider_error",
        EmptyResponse = "empty_response",
        Judge = "judge",
        Echo = "echo",
        JudgeError = "judge_error",
        Manual = "manual",
        NoActions = "no_actions",
    }
);

impl ReviewReason {
    /// The reasons of a stored `review_reason` (comma-separated); `Err` names one that is
    /// not in the vocabulary.
    pub fn parse_list(stored: &str) -> Result<Vec<ReviewReason>, String> {
        stored
            .split(',')
            .filter(|r| !r.is_empty())
            .map(|r| ReviewReason::parse(r).ok_or_else(|| format!("{r:?} is not a review reason")))
            .collect()
    }
}
