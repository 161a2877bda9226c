//! Recall on synthetic secrets in realistic surroundings, and false
//! positives on a benign corpus.
//!
//! Run with `--nocapture` to read the figures.

// Helpers outside #[test] functions fail loudly too.

use crate::common::{Rng, expand};
use foldgate_scrub::RuleSet;

/// A secret format: its template and the variable names people give it.
struct Kind {
    name: &'static str,
    template: &'static str,
    vars: &'static [&'static str],
}

const KINDS: &[Kind] = &[
    Kind { name: "github classic", template: "ghp_{an:36}", vars: &["GITHUB_TOKEN", "GH_TOKEN"] },
    Kind {
        name: "github fine-grained",
        template: "github_pat_11{UPAN:20}_{an:59}",
        vars: &["GITHUB_PAT"],
    },
    Kind { name: "github app", template: "ghs_{an:36}", vars: &["INSTALLATION_TOKEN"] },
    Kind { name: "gitlab", template: "glpat-{b64u:20}", vars: &["GITLAB_TOKEN", "CI_PUSH_TOKEN"] },
    Kind {
        name: "aws key id",
        template: "AKIA{b32:16}",
        vars: &["AWS_ACCESS_KEY_ID", "aws_access_key_id"],
    },
    Kind {
        name: "aws secret",
        template: "{b64:40}",
        vars: &["AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"],
    },
    Kind {
        name: "gcp api key",
        template: "AIza{b64u:35}",
        vars: &["GOOGLE_API_KEY", "FIREBASE_API_KEY"],
    },
    Kind {
        name: "azure storage",
        template: "DefaultEndpointsProtocol=https;AccountName=prodstore;AccountKey={b64:86}==;EndpointSuffix=core.windows.net",
        vars: &["AZURE_STORAGE_CONNECTION_STRING"],
    },
    Kind {
        name: "slack bot",
        template: "xoxb-{dig:12}-{dig:13}-{an:24}",
        vars: &["SLACK_BOT_TOKEN"],
    },
    Kind {
        name: "slack webhook",
        template: "https://hooks.slack.com/services/T{UPAN:10}/B{UPAN:10}/{an:24}",
        vars: &["SLACK_WEBHOOK_URL"],
    },
    Kind {
        name: "discord webhook",
        template: "https://discord.com/api/webhooks/{dig:19}/{b64u:68}",
        vars: &["DISCORD_WEBHOOK"],
    },
    Kind { name: "telegram", template: "{dig:10}:AA{b64u:33}", vars: &["TELEGRAM_BOT_TOKEN"] },
    Kind {
        name: "stripe",
        template: "sk_live_{an:99}",
        vars: &["STRIPE_SECRET_KEY", "stripe_api_key"],
    },
    Kind { name: "stripe webhook", template: "whsec_{an:32}", vars: &["STRIPE_WEBHOOK_SECRET"] },
    Kind { name: "sendgrid", template: "SG.{b64u:22}.{b64u:43}", vars: &["SENDGRID_API_KEY"] },
    Kind { name: "twilio key", template: "SK{hex:32}", vars: &["TWILIO_API_KEY"] },
    Kind { name: "twilio auth", template: "{hex:32}", vars: &["TWILIO_AUTH_TOKEN"] },
    Kind { name: "mailgun", template: "key-{hex:32}", vars: &["MAILGUN_API_KEY"] },
    Kind {
        name: "openai project",
        template: "sk-proj-{b64u:74}T3BlbkFJ{b64u:74}",
        vars: &["OPENAI_API_KEY"],
    },
    Kind { name: "anthropic", template: "sk-ant-api03-{b64u:93}AA", vars: &["ANTHROPIC_API_KEY"] },
    Kind {
        name: "hugging face",
        template: "hf_{alpha:34}",
        vars: &["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"],
    },
    Kind { name: "groq", template: "gsk_{an:52}", vars: &["GROQ_API_KEY"] },
    Kind { name: "cohere", template: "{an:40}", vars: &["COHERE_API_KEY"] },
    Kind { name: "replicate", template: "r8_{an:37}", vars: &["REPLICATE_API_TOKEN"] },
    Kind { name: "npm", template: "npm_{an:36}", vars: &["NPM_TOKEN"] },
    Kind {
        name: "pypi",
        template: "pypi-AgEIcHlwaS5vcmc{b64u:150}",
        vars: &["TWINE_PASSWORD", "PYPI_TOKEN"],
    },
    Kind { name: "docker hub", template: "dckr_pat_{b64u:27}", vars: &["DOCKERHUB_TOKEN"] },
    Kind { name: "crates.io", template: "cio{an:32}", vars: &["CARGO_REGISTRY_TOKEN"] },
    Kind {
        name: "digitalocean",
        template: "dop_v1_{hex:64}",
        vars: &["DIGITALOCEAN_ACCESS_TOKEN"],
    },
    Kind { name: "vault", template: "hvs.{b64u:90}", vars: &["VAULT_TOKEN"] },
    Kind { name: "shopify", template: "shpat_{hex:32}", vars: &["SHOPIFY_ACCESS_TOKEN"] },
    Kind { name: "datadog", template: "{hex:32}", vars: &["DD_API_KEY", "DATADOG_API_KEY"] },
    Kind { name: "new relic", template: "NRAK-{UPAN:27}", vars: &["NEW_RELIC_API_KEY"] },
    Kind {
        name: "sentry dsn",
        template: "https://{hex:32}@o{dig:6}.ingest.sentry.io/{dig:7}",
        vars: &["SENTRY_DSN"],
    },
    Kind { name: "linear", template: "lin_api_{an:40}", vars: &["LINEAR_API_KEY"] },
    Kind { name: "notion", template: "ntn_{dig:11}{an:35}", vars: &["NOTION_TOKEN"] },
    Kind { name: "atlassian", template: "ATATT3{b64u:186}", vars: &["JIRA_API_TOKEN"] },
    Kind { name: "databricks", template: "dapi{hex:32}", vars: &["DATABRICKS_TOKEN"] },
    Kind {
        name: "jwt",
        template: "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJ{b64u:80}.{b64u:86}",
        vars: &["ID_TOKEN", "access_token"],
    },
    Kind {
        name: "database url",
        template: "postgres://app:{an:20}@db.internal:5432/app",
        vars: &["DATABASE_URL"],
    },
    Kind {
        name: "password",
        template: "{an:10}{dig:2}!",
        vars: &["DB_PASSWORD", "password", "admin_password"],
    },
    Kind {
        name: "generic api key",
        template: "{an:32}",
        vars: &["API_KEY", "client_secret", "apiKey"],
    },
    Kind { name: "age", template: "AGE-SECRET-KEY-1{bech:58}", vars: &["SOPS_AGE_KEY"] },
];

/// Surroundings a secret shows up in. `{VAR}` is the variable name, `{S}`
/// the secret.
const CONTEXTS: &[(&str, &str)] = &[
    (".env", "# production settings\nNODE_ENV=production\n{VAR}={S}\nLOG_LEVEL=info\n"),
    ("shell", "$ export {VAR}=\"{S}\"\n$ ./deploy.sh --region eu-west-1\n"),
    (
        "yaml",
        "services:\n  api:\n    image: registry.internal/api:1.4.2\n    environment:\n      {VAR}: \"{S}\"\n      PORT: \"8080\"\n",
    ),
    ("json", "{\"name\": \"worker\", \"env\": {\"{VAR}\": \"{S}\", \"REPLICAS\": \"3\"}}"),
    (
        "log",
        "2024-05-01T12:00:01.123Z DEBUG config loaded: {VAR}={S} region=eu-west-1\n2024-05-01T12:00:01.456Z INFO  listening on :8080\n",
    ),
    (
        "python",
        "import os\n\nclient = Client(\n    base_url=\"https://api.internal\",\n    {VAR}=\"{S}\",\n)\n",
    ),
    (
        "javascript",
        "const config = {\n  region: 'eu-west-1',\n  {VAR}: '{S}',\n};\nmodule.exports = config;\n",
    ),
    ("toml", "[deploy]\nregion = \"eu-west-1\"\n{VAR} = \"{S}\"\n"),
    (
        "go",
        "func newClient() *Client {\n\treturn &Client{Region: \"eu-west-1\", {VAR}: \"{S}\"}\n}\n",
    ),
];

/// A multi-line secret that cannot sit inside one-line contexts.
const PEM_CASES: &[&str] = &[
    "-----BEGIN RSA PRIVATE KEY-----\n{b64:64}\n{b64:64}\n{b64:30}==\n-----END RSA PRIVATE KEY-----\n",
    "-----BEGIN OPENSSH PRIVATE KEY-----\n{b64:70}\n{b64:70}\n-----END OPENSSH PRIVATE KEY-----\n",
    "-----BEGIN EC PRIVATE KEY-----\n{b64:64}\n{b64:20}\n-----END EC PRIVATE KEY-----\n",
    "{{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----\\n{b64:64}\\n{b64:64}\\n-----END PRIVATE KEY-----\\n\"}}",
    "$ cat ~/.ssh/id_ed25519\n-----BEGIN OPENSSH PRIVATE KEY-----\n{b64:70}\n{b64:30}\n-----END OPENSSH PRIVATE KEY-----\n",
    "curl -H 'Authorization: Bearer {b64u:48}' https://api.internal/v1/jobs\n",
    "curl -u deploy:{an:16} https://ci.internal/job/build\n",
    "mysql -h db.internal -u root -p{an:14} app < dump.sql\n",
];

/// Whether the secret, and every 10-character window of it, is gone.
fn fully_hidden(output: &str, secret: &str) -> bool {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() < 10 {
        return !output.contains(secret);
    }
    chars.windows(10).map(|w| w.iter().collect::<String>()).all(|w| !output.contains(&w))
}

#[test]
fn recall_on_synthetic_secrets_in_context() {
    let rules = RuleSet::builtin().unwrap();
    let mut total = 0usize;
    let mut caught = 0usize;
    let mut misses = Vec::new();
    for kind in KINDS {
        for (ci, (ctx_name, ctx)) in CONTEXTS.iter().enumerate() {
            let var = kind.vars[ci % kind.vars.len()];
            let mut rng = Rng::from_label(&format!("{}/{ctx_name}", kind.name));
            let (secret, generated) = expand(kind.template, &mut rng);
            let text = ctx.replace("{VAR}", var).replace("{S}", &secret);
            let out = rules.scrub_text(&text).unwrap();
            total += 1;
            if generated.iter().all(|g| fully_hidden(&out.text, g)) {
                caught += 1;
            } else {
                misses.push(format!("{} in {ctx_name}: {:?}", kind.name, out.text));
            }
        }
    }
    for (i, template) in PEM_CASES.iter().enumerate() {
        let mut rng = Rng::new(i as u64);
        let (text, generated) = expand(template, &mut rng);
        let out = rules.scrub_text(&text).unwrap();
        total += 1;
        if generated.iter().all(|g| fully_hidden(&out.text, g)) {
            caught += 1;
        } else {
            misses.push(format!("multi-line case {i}: {:?}", out.text));
        }
    }
    let recall = caught as f64 / total as f64;
    println!(
        "recall: {caught}/{total} = {:.3} ({} formats x {} contexts + {} extra cases)",
        recall,
        KINDS.len(),
        CONTEXTS.len(),
        PEM_CASES.len()
    );
    for m in &misses {
        println!("  missed: {m}");
    }
    assert!(recall >= 0.95, "recall {recall:.3} below 0.95");
}

/// Benign text of many kinds: none of it may be touched.
fn benign_corpus() -> Vec<(String, String)> {
    let mut rng = Rng::new(42);
    let hex = "0123456789abcdef";
    let b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut docs: Vec<(String, String)> = Vec::new();
    // Our own source code: Rust full of the words "secret", "token", "key".
    for (name, src) in [
        ("src/scan.rs", include_str!("../../src/scan.rs")),
        ("src/rules.rs", include_str!("../../src/rules.rs")),
        ("src/json.rs", include_str!("../../src/json.rs")),
        ("src/translate.rs", include_str!("../../src/translate.rs")),
        ("src/ruleset.rs", include_str!("../../src/ruleset.rs")),
    ] {
        docs.push((name.to_owned(), src.to_owned()));
    }
    docs.push(("prose".into(), PROSE.into()));
    docs.push(("lorem".into(), LOREM.into()));
    docs.push(("python".into(), PYTHON.into()));
    docs.push(("javascript".into(), JAVASCRIPT.into()));
    docs.push(("k8s yaml".into(), K8S.into()));
    docs.push(("github actions".into(), ACTIONS.into()));
    docs.push(("env example".into(), ENV_EXAMPLE.into()));
    docs.push(("urls".into(), URLS.into()));
    docs.push(("sql and html".into(), SQL_HTML.into()));
    let uuids: Vec<String> = (0..200)
        .map(|_| {
            format!(
                "{}-{}-4{}-8{}-{}",
                rng.string(hex, 8),
                rng.string(hex, 4),
                rng.string(hex, 3),
                rng.string(hex, 3),
                rng.string(hex, 12)
            )
        })
        .collect();
    docs.push((
        "uuids".into(),
        uuids
            .iter()
            .enumerate()
            .map(|(i, u)| format!("{{\"id\": \"{u}\", \"request_id\": \"{u}\", \"seq\": {i}}}\n"))
            .collect(),
    ));
    let log: String = (0..200)
        .map(|i| {
            format!(
                "commit {}\nAuthor: Dev {i} <dev{i}@example.org>\n\n    Fix parsing of keys in config loader (#{i})\n\n",
                rng.string(hex, 40)
            )
        })
        .collect();
    docs.push(("git log".into(), log));
    let sums: String = (0..200)
        .map(|i| {
            format!(
                "{}  dist/app-{i}.tar.gz\nmd5 {} sha1 {}\nsha256:{}\n",
                rng.string(hex, 64),
                rng.string(hex, 32),
                rng.string(hex, 40),
                rng.string(hex, 64)
            )
        })
        .collect();
    docs.push(("hashes".into(), sums));
    docs.push((
        "base64 image".into(),
        format!(
            "<img alt=\"logo\" src=\"data:image/png;base64,iVBORw0KGgo{}==\">\n",
            rng.string(b64, 4000)
        ),
    ));
    docs.push((
        "lockfile".into(),
        (0..100)
            .map(|i| {
                format!(
                    "\"node_modules/pkg-{i}\": {{\"version\": \"1.{i}.0\", \"resolved\": \"https://registry.npmjs.org/pkg-{i}/-/pkg-{i}-1.{i}.0.tgz\", \"integrity\": \"sha512-{}==\"}},\n",
                    rng.string(b64, 86)
                )
            })
            .collect(),
    ));
    docs
}

#[test]
fn no_false_positives_on_benign_corpus() {
    let rules = RuleSet::builtin().unwrap();
    let docs = benign_corpus();
    let mut bytes = 0;
    let mut false_positives = Vec::new();
    for (name, text) in &docs {
        bytes += text.len();
        let out = rules.scrub_text(text).unwrap();
        if !out.report.is_clean() {
            for (line_before, line_after) in text.lines().zip(out.text.lines()) {
                if line_before != line_after {
                    false_positives.push(format!("{name}: {line_before:?} -> {line_after:?}"));
                }
            }
        }
    }
    println!(
        "false positives: {} in {} benign documents ({bytes} bytes)",
        false_positives.len(),
        docs.len()
    );
    for fp in &false_positives {
        println!("  {fp}");
    }
    assert!(false_positives.is_empty());
}

const PROSE: &str = "\
Authentication overview

Every request to the API carries a bearer token in the Authorization header.
Tokens are issued by the identity service and expire after one hour; a
refresh token can be exchanged for a new access token. Never commit a token,
password or private key to the repository. Secrets belong in the vault, and
the deploy job reads them at start-up. If you suspect a key has leaked,
rotate it immediately and tell the security team.

To configure the client, set the GITHUB_TOKEN environment variable to your
personal access token, or pass --token on the command line. The password
policy requires at least twelve characters. Basic authentication is disabled
for all public endpoints. The bearer of this message is authorised to collect
the parcel. Keys are rotated every 90 days; the API key prefix shows which
environment a key belongs to.
";

const LOREM: &str = "\
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor
incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis
nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.
Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu
fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in
culpa qui officia deserunt mollit anim id est laborum.
";

const PYTHON: &str = r#"
import getpass
import os

from app.settings import settings


def connect(user: str, password: str | None = None, token: str = "") -> Connection:
    """Open a connection; prompt for the password when none is given."""
    password = password or getpass.getpass("Password: ")
    api_key = settings.OPENAI_API_KEY
    secret = os.environ["APP_SECRET"]
    token = os.getenv("SERVICE_TOKEN", "")
    if not token:
        raise ValueError("token must not be empty")
    auth = {"username": user, "password": password}
    return Connection(auth=auth, api_key=api_key, secret_key=secret)


class Settings(BaseSettings):
    password: Optional[str] = None
    api_key: SecretStr
    access_token: str = Field(default="", description="access token for the API")
"#;

const JAVASCRIPT: &str = r#"
export async function login(username, password) {
  const response = await fetch(`${BASE_URL}/login`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${token}` },
    body: JSON.stringify({ username, password }),
  });
  const { token: accessToken, refreshToken } = await response.json();
  localStorage.setItem('token', accessToken);
  return { accessToken, refreshToken, secret: process.env.CLIENT_SECRET };
}
const apiKey = config.get('apiKey');
const password_hash = await bcrypt.hash(password, 12);
"#;

const K8S: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  template:
    spec:
      containers:
        - name: api
          image: registry.internal/api@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
          env:
            - name: DB_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: db-credentials
                  key: password
            - name: API_TOKEN
              valueFrom:
                secretKeyRef: {name: api-token, key: token}
      volumes:
        - name: tls
          secret:
            secretName: api-tls
"#;

const ACTIONS: &str = r#"
name: release
on: { push: { tags: ["v*"] } }
jobs:
  publish:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: cargo publish --token "$CARGO_REGISTRY_TOKEN"
        env:
          CARGO_REGISTRY_TOKEN: ${{ secrets.CARGO_REGISTRY_TOKEN }}
      - uses: docker/login-action@v3
        with:
          username: ${{ vars.DOCKERHUB_USERNAME }}
          password: ${{ secrets.DOCKERHUB_TOKEN }}
      - run: echo "$TOKEN" | docker login --password-stdin -u ci registry.internal
"#;

const ENV_EXAMPLE: &str = "\
# Copy to .env and fill in real values.
DATABASE_URL=postgres://app:changeme@localhost:5432/app
REDIS_URL=redis://localhost:6379/0
GITHUB_TOKEN=<your-token>
OPENAI_API_KEY=sk-your-key-here
AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE
AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}
STRIPE_SECRET_KEY=
SESSION_SECRET=
SMTP_PASSWORD=
";

const URLS: &str = "\
https://github.com/rust-lang/regex/blob/master/README.md
https://docs.example.org/api/v2/users?page=2&per_page=50#pagination
git@github.com:foldgate/foldgate.git
ssh://git@git.internal:2222/platform/infra.git
https://user@example.org/path/to/resource
http://localhost:8080/healthz
https://example.org:8443/login?next=/dashboard
mailto:ops@example.org
https://cdn.example.org/assets/app.4f3c2a1b.js
";

const SQL_HTML: &str = r#"
SELECT id, email, password_hash FROM users WHERE email = $1 AND password_hash = crypt($2, password_hash);
UPDATE api_keys SET revoked_at = now() WHERE key_prefix = 'ak_live';
<form method="post" action="/login">
  <label for="password">Password</label>
  <input type="password" name="password" id="password" autocomplete="current-password">
  <input type="hidden" name="csrf_token" value="{{ csrf_token }}">
</form>
"#;
