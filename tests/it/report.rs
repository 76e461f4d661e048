//! `pieval report`: the numbers are the SQL's, hostile text never runs and nothing is
//! fetched (checked in headless Chromium), the page renders at desktop and phone widths.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::common::{pieval, read_jsonl, repo, run, write_jsonl};
use serde_json::{Value, json};

/// The marker every vector tries to set; the test reads it back from the live DOM.
const MARK: &str = "document.documentElement.setAttribute('data-xss','1')";

/// Cross-site scripting vectors: script tags, event handlers, `javascript:` URLs, SVG and
/// MathML tricks, broken-out attributes and elements, CSS, Unicode tricks, and requests to
/// `PORT` (a listener the test owns).
pub(crate) fn vectors(port: u16) -> Vec<String> {
    let s = MARK;
    let b64 = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let u = format!("http://127.0.0.1:{port}");
    vec![
        format!("<script>{s}</script>"),
        format!("<img src=x onerror=\"{s}\">"),
        format!("<svg onload=\"{s}\">"),
        format!("<svg/onload={s}>"),
        format!("<svg><script>{s}</script></svg>"),
        format!("<math><mtext><table><mglyph><style><img src=x onerror=\"{s}\">"),
        format!("\"><script>{s}</script>"),
        format!("'><img src=x onerror={s}>"),
        format!("\" onmouseover=\"{s}\" x=\""),
        format!("' autofocus onfocus='{s}' x='"),
        format!("</textarea><script>{s}</script>"),
        format!("</title><script>{s}</script>"),
        format!("</style><script>{s}</script>"),
        format!("</pre><script>{s}</script><pre>"),
        format!("<iframe src=\"javascript:{s}\"></iframe>"),
        format!("<iframe srcdoc=\"<script>{s}</script>\"></iframe>"),
        format!("<a href=\"javascript:{s}\">click</a>"),
        format!("<body onload=\"{s}\">"),
        format!("<details open ontoggle=\"{s}\">"),
        format!("<input autofocus onfocus=\"{s}\">"),
        format!("<select autofocus onfocus=\"{s}\">"),
        format!("<textarea autofocus onfocus=\"{s}\"></textarea>"),
        format!("<video><source onerror=\"{s}\"></video>"),
        format!("<audio src=x onerror=\"{s}\">"),
        format!("<object data=\"javascript:{s}\"></object>"),
        format!("<embed src=\"javascript:{s}\">"),
        format!("<form><button formaction=\"javascript:{s}\">x</button></form>"),
        format!("<marquee onstart=\"{s}\">x</marquee>"),
        format!("<svg><animate onbegin=\"{s}\" attributeName=x dur=1s>"),
        format!("<svg><a xlink:href=\"javascript:{s}\"><text>x</text></a></svg>"),
        format!("<math href=\"javascript:{s}\">x</math>"),
        format!("<svg><foreignObject><body onload=\"{s}\"></body></foreignObject></svg>"),
        format!("<scr<script>ipt>{s}</script>"),
        format!("<img \"\"\"><script>{s}</script>\">"),
        format!("<noscript><p title=\"</noscript><img src=x onerror={s}>\">"),
        format!("<template><script>{s}</script></template>"),
        format!("<!--<img src=\"--><img src=x onerror={s}//\">"),
        format!("<![CDATA[<script>{s}</script>]]>"),
        format!("javascript:{s}"),
        format!("data:text/html,<script>{s}</script>"),
        format!("<img src=x onerror=eval(atob('{b64}'))>"),
        format!(
            "<img src=x onerror=\"&#100;ocument.documentElement.setAttribute('data-xss','1')\">"
        ),
        format!("\u{202e}<script>{s}</script>"),
        format!("<img src=x\u{2028}onerror={s}>"),
        format!("＜script＞{s}＜/script＞"),
        format!("<div style=\"background:url(javascript:{s})\">x</div>"),
        format!("<div style=\"width:expression({s})\">x</div>"),
        format!("<meta http-equiv=\"refresh\" content=\"0;url=javascript:{s}\">"),
        format!("<base href=\"{u}/base/\">"),
        format!("<img src=\"{u}/img\">"),
        format!("<img srcset=\"{u}/srcset 1x\">"),
        format!("<link rel=stylesheet href=\"{u}/link.css\">"),
        format!("<style>@import '{u}/import.css';</style>"),
        format!("<style>*{{background:url('{u}/bg')}}</style>"),
        format!("<script src=\"{u}/script.js\"></script>"),
        format!("<a id=x tabindex=1 autofocus onfocusin=\"{s}\">x</a>"),
        format!("{{{{ {s} }}}}{{% raw %}}<script>{s}</script>"),
        format!("<x onclick=\"{s}\" style=\"display:block;position:fixed;inset:0\">"),
    ]
}

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = std::process::Command::new("which").arg(name).output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!(
        "headless Chromium is needed for the report tests: install it (apt-get install chromium); .ci/run does"
    );
}

/// Headless Chromium on `page` at `width` px, with `extra` arguments (what to produce).
fn headless(page: &Path, width: u32, height: u32, extra: &[String]) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(chromium())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .args(["--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={width},{height}"))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DOM after the page has loaded and run what it would.
fn dump_dom(page: &Path, width: u32) -> String {
    let extra = [
        "--virtual-time-budget=3000".to_owned(),
        "--dump-dom".to_owned(),
    ];
    String::from_utf8_lossy(&headless(page, width, 2000, &extra).stdout).into_owned()
}

/// A scored run under `results/<id>` from `cases` and one response per case.
fn scored(results: &Path, id: &str, cases: &[Value], responses: &[String]) -> PathBuf {
    std::fs::create_dir_all(results).unwrap();
    let corpus = results.join(format!("{id}-cases.jsonl"));
    write_jsonl(&corpus, cases);
    let preds: Vec<Value> = cases
        .iter()
        .zip(responses)
        .enumerate()
        .map(|(i, (c, r))| {
            json!({"case_id": c["case_id"], "response_text": r, "latency_ms": 10.0 + i as f64, "model_name": "m"})
        })
        .collect();
    let p = results.join(format!("{id}-p.jsonl"));
    write_jsonl(&p, &preds);
    let out = results.join(id);
    let r = run(pieval()
        .args(["score", "--run-id", id, "--predictions"])
        .arg(&p)
        .arg("--cases")
        .arg(&corpus)
        .arg("--output")
        .arg(&out));
    assert_eq!(r.code, 0, "{}", r.stderr);
    out
}

#[test]
fn hostile_text_never_runs_and_nothing_is_fetched() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let vectors = vectors(port);
    assert!(vectors.len() >= 50, "{}", vectors.len());
    let corpus = read_jsonl(&repo("data/normalized/attack_cases.enriched.jsonl"));
    let cases: Vec<Value> = corpus
        .iter()
        .filter(|c| c["label"] != "benign")
        .take(vectors.len())
        .zip(&vectors)
        .map(|(c, v)| {
            let mut c = c.clone();
            c["prompt"] = json!(format!("Summarize this. {v}"));
            c["expected_target"] = json!(v);
            c["success_criteria"] = json!({"type": "contains", "value": v});
            c
        })
        .collect();
    let responses: Vec<String> = vectors.iter().map(|v| format!("Sure: {v} done")).collect();
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let run_dir = scored(&results, "xss", &cases, &responses);
    let r = run(pieval().arg("report").arg(&run_dir));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let page = run_dir.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // Every vector is on the page, as text.
    assert!(
        html.contains("successful attack(s)"),
        "the successes section is there"
    );
    let dom = dump_dom(&page, 1280);
    assert!(
        dom.contains("Sure: "),
        "the page rendered: {}",
        &dom[..dom.len().min(500)]
    );
    let html_tag = &dom[dom.find("<html").unwrap()..];
    let html_tag = &html_tag[..html_tag.find('>').unwrap()];
    if html_tag.contains("data-xss") {
        let keep = std::env::temp_dir().join("pieval-xss-report.html");
        std::fs::copy(&page, &keep).unwrap();
        panic!(
            "a vector ran: the page set the marker (page kept at {})",
            keep.display()
        );
    }
    // The text of each vector is shown (escaped, so it reads back as the same text).
    for v in vectors.iter().take(5) {
        let escaped = v
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(
            dom.contains(&escaped) || dom.contains(v.as_str()),
            "vector not shown: {v}"
        );
    }
    // No request left the page.
    let mut hits = Vec::new();
    while let Ok((mut s, _)) = listener.accept() {
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).unwrap_or(0);
        hits.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(hits.is_empty(), "the page made requests: {hits:?}");
    // Nothing from a case became markup: every tag on the page is one the template
    // writes, and no attribute holds a handler, a script URL or a style.
    let tag = regex::Regex::new(r"<([a-zA-Z][a-zA-Z0-9]*)([^>]*)>").unwrap();
    let allowed = [
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "main",
        "h1",
        "h2",
        "h3",
        "p",
        "span",
        "dl",
        "dt",
        "dd",
        "div",
        "figure",
        "figcaption",
        "svg",
        "line",
        "text",
        "rect",
        "circle",
        "table",
        "tr",
        "th",
        "td",
        "details",
        "summary",
        "pre",
        "mark",
        "a",
        "footer",
        "br",
    ];
    for m in tag.captures_iter(&html) {
        assert!(
            allowed.contains(&&m[1]),
            "a <{}> tag reached the page",
            &m[1]
        );
        let attrs = m[2].to_ascii_lowercase();
        assert!(
            !attrs.contains("javascript:")
                && !regex::Regex::new(r"\son[a-z]+\s*=")
                    .unwrap()
                    .is_match(&attrs)
                && !attrs.contains(" style="),
            "a live attribute: <{}{}>",
            &m[1],
            &m[2]
        );
    }
}

/// The page with a probe that records whether anything is wider than the window (the
/// probe runs only in this copy: the report itself has no script and forbids one).
fn probe_copy(page: &Path) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap();
    let csp_start = html
        .find("<meta http-equiv=\"Content-Security-Policy\"")
        .unwrap();
    let csp_end = csp_start + html[csp_start..].find('>').unwrap() + 1;
    let probe = "<script>addEventListener('load',()=>{const w=document.documentElement.clientWidth;let wide=[...document.querySelectorAll('body *')].filter(e=>{const r=e.getBoundingClientRect();return r.right>w+1&&!e.closest('.scroll')}).map(e=>e.tagName+'.'+e.className);document.documentElement.setAttribute('data-wide',wide.length?wide.slice(0,5).join(' '):'none');document.documentElement.setAttribute('data-scrollw',String(document.documentElement.scrollWidth-w))});</script>";
    let copy = format!("{}{}{}", &html[..csp_start], probe, &html[csp_end..]);
    let path = page.with_file_name("probe.html");
    std::fs::write(&path, copy).unwrap();
    path
}

#[test]
fn the_report_renders_at_desktop_and_phone_widths_and_says_what_sql_says() {
    let corpus = read_jsonl(&repo("data/normalized/attack_cases.enriched.jsonl"));
    let cases: Vec<Value> = corpus.iter().step_by(37).take(60).cloned().collect();
    let responses: Vec<String> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| match i % 4 {
            0 => format!("Sure. {}", c["expected_target"].as_str().unwrap_or("PWNED")),
            1 => "I'm sorry, but I can't help with that.".into(),
            2 => format!("{} {}", "a-very-long-unbroken-token".repeat(40), i),
            _ => "Here is a short summary of the document.".into(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let a = scored(&results, "a", &cases, &responses);
    let quiet: Vec<String> = responses.iter().map(|_| "No.".to_owned()).collect();
    let b = scored(&dir.path().join("other"), "b", &cases, &quiet);
    let r = run(pieval()
        .arg("report")
        .arg(&a)
        .args(["--compare"])
        .arg(&b)
        .arg("--output")
        .arg(dir.path().join("cmp.html")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let page = dir.path().join("cmp.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // Nulls and booleans read as words; the report sits outside the run folder, so its
    // links to the run's files are relative to where it is.
    for raw in [">None<", ">True<", ">False<"] {
        if let Some(at) = html.find(raw) {
            panic!(
                "raw value in the page: {}",
                &html[at.saturating_sub(300)..at + 20]
            );
        }
    }
    assert!(
        html.contains("href=\"results/a/case_results.parquet\"")
            || !html.contains("case_results.parquet\"")
    );
    assert!(html.contains("Mitigations compared") && html.contains("Cases that flipped"));

    // The numbers are the SQL's: the report's rates are summary.sql's rows, and each
    // headline on the page is that row's rate.
    let part = pieval::report::run_part(&a).unwrap();
    // `pieval sql` over the results folder (run a alone) runs the same files.
    let sql = |file: &str| {
        let r = run(pieval()
            .args(["sql", "--format", "json", "--file"])
            .arg(repo(file))
            .arg("--results")
            .arg(&results)
            .arg("--cases")
            .arg(results.join("a-cases.jsonl")));
        assert_eq!(r.code, 0, "{file}: {}", r.stderr);
        r.stdout
    };
    let only_a = sql("queries/summary.sql");
    // `pieval sql --format json` leaves null fields out; the report keeps them.
    let strip = |rows: &[Value]| -> Vec<Value> {
        rows.iter()
            .map(|r| {
                let mut r = r.clone();
                if let Some(o) = r.as_object_mut() {
                    o.retain(|_, v| !v.is_null());
                }
                r
            })
            .collect()
    };
    let expected: Vec<Value> = serde_json::from_str(&only_a).unwrap();
    assert_eq!(strip(&part.rates), expected);
    for q in ["successes", "leaks", "cases", "controls"] {
        let out = sql(&format!("queries/report/{q}.sql"));
        let rows: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
        let mine = match q {
            "successes" => &part.successes,
            "leaks" => &part.leaks,
            "cases" => &part.cases,
            _ => &part.controls,
        };
        assert_eq!(strip(mine), rows, "{q}");
    }
    let asr = part
        .rates
        .iter()
        .find(|r| r["metric"] == "attack_success_rate" && r["dimension"] == "all")
        .unwrap();
    let shown = format!("{:.1}%", asr["rate"].as_f64().unwrap() * 100.0);
    assert!(
        html.contains(&format!("<div class=\"big\">{shown}</div>")),
        "{shown}"
    );

    // It renders at a desktop and a phone width; nothing is wider than the window
    // (tables scroll inside their own box).
    let probe = probe_copy(&page);
    for width in [1280, 390] {
        let dom = dump_dom(&probe, width);
        assert!(
            dom.contains("data-wide=\"none\""),
            "{width}px: too wide: {}",
            {
                let at = dom.find("data-wide").unwrap_or(0);
                &dom[at..(at + 200).min(dom.len())]
            }
        );
        assert!(
            dom.contains("data-scrollw=\"0\""),
            "{width}px: the page scrolls sideways"
        );
        let shot = dir.path().join(format!("shot-{width}.png"));
        headless(
            &page,
            width,
            1600,
            &[format!("--screenshot={}", shot.display())],
        );
        let png = std::fs::read(&shot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 20_000,
            "{width}px screenshot"
        );
    }
}

#[test]
fn a_run_writes_its_report_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let r = run(pieval()
        .args(["run", "--dry-run", "--sample-size", "4", "--output-dir"])
        .arg(dir.path().join("results"))
        .arg(repo("data/experiments/quickstart.yaml")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("report: "))
        .unwrap();
    let path = PathBuf::from(line.trim_start_matches("report: "));
    assert!(path.ends_with("report.html") && path.is_file(), "{line}");
}
