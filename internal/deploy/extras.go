package deploy

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// What a bundle adds beside the configs, certificates and tokens, so that
// an operator can run it as they run other services: a systemd unit per
// node, a Dockerfile for the static binary, a compose.yaml of the whole
// topology and a README with the start commands.

// extras plans the units, the Dockerfile, compose.yaml and README.md of a
// new bundle.
func (p *planner) extras() error {
	for _, r := range p.node {
		if err := p.unit(r); err != nil {
			return err
		}
	}
	p.file(DockerfileFile, 0o644, []byte(strings.Replace(dockerfile, "WRITTEN_BY", p.writtenBy(""), 1)), false)
	p.file(DockerIgnore, 0o644, []byte("# Only the binary goes into the image: keys and tokens stay out of the build.\n*\n!"+BinaryName+"\n"), false)
	compose, err := p.compose()
	if err != nil {
		return err
	}
	p.file(ComposeFile, 0o644, compose, false)
	if p.s.Kubernetes != nil {
		if err := p.kube(); err != nil {
			return err
		}
	}
	p.file(ReadmeFile, 0o644, []byte(p.readme()), false)
	return nil
}

// installDir is where node r's files go on its machine; stateDir is its
// data directory there under systemd (StateDirectory=).
func installDir(r nodeRun) string {
	if r.id == "" {
		return InstallConfig
	}
	return InstallConfig + "/" + r.id
}

func stateDir(r nodeRun) string {
	if r.id == "" {
		return "ticketingd"
	}
	return "ticketingd/" + r.id
}

// unitFile is the path in the bundle of node r's systemd unit.
func unitFile(r nodeRun) string {
	if r.id == "" {
		return SingleUnitFile
	}
	return path.Join(r.dir, NodeUnitFile(r.id))
}

// unit plans node r's systemd unit: its own user, the data directory as
// StateDirectory, and the sandboxing a lock server needs none of the
// privileges of.
func (p *planner) unit(r nodeRun) error {
	what := "the Ticketing lock server"
	if r.id != "" {
		what = fmt.Sprintf("Ticketing lock server, %s node %s", p.s.Topology, r.id)
	}
	caps := ""
	for _, port := range r.ports {
		if port < 1024 {
			caps = "CAP_NET_BIND_SERVICE"
		}
	}
	var u strings.Builder
	fmt.Fprintf(&u, "# systemd unit of %s, written by %s.\n", what, p.writtenBy(""))
	fmt.Fprintf(&u, "# Its config and the files it names go to %s, readable by the user\n", installDir(r))
	fmt.Fprintf(&u, "# %s; its data directory is %s/%s (see README.md).\n", ServiceUser, "/var/lib", stateDir(r))
	fmt.Fprintf(&u, "[Unit]\nDescription=%s\n", what)
	fmt.Fprintf(&u, "After=network-online.target\nWants=network-online.target\n\n")
	fmt.Fprintf(&u, "[Service]\nType=exec\nUser=%s\nGroup=%s\n", ServiceUser, ServiceUser)
	fmt.Fprintf(&u, "ExecStart=%s serve --config %s/%s --data-dir /var/lib/%s\n", InstallBinary, installDir(r), ConfigFile, stateDir(r))
	fmt.Fprintf(&u, "Restart=on-failure\nRestartSec=2s\nTimeoutStopSec=30s\nLimitNOFILE=65536\n")
	fmt.Fprintf(&u, "StateDirectory=%s\nStateDirectoryMode=0700\nUMask=0077\n", stateDir(r))
	u.WriteString("NoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=yes\nPrivateTmp=yes\nPrivateDevices=yes\n" +
		"ProtectKernelTunables=yes\nProtectKernelModules=yes\nProtectKernelLogs=yes\nProtectControlGroups=yes\n" +
		"ProtectClock=yes\nProtectHostname=yes\nRestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX\n" +
		"RestrictNamespaces=yes\nRestrictRealtime=yes\nRestrictSUIDSGID=yes\nLockPersonality=yes\n" +
		"MemoryDenyWriteExecute=yes\nSystemCallArchitectures=native\nSystemCallFilter=@system-service\n" +
		"SystemCallErrorNumber=EPERM\nRemoveIPC=yes\nPrivateMounts=yes\nProtectProc=invisible\n")
	fmt.Fprintf(&u, "CapabilityBoundingSet=%s\n", caps)
	if caps != "" {
		fmt.Fprintf(&u, "AmbientCapabilities=%s\n", caps)
	}
	u.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	p.file(unitFile(r), 0o644, []byte(u.String()), false)
	return nil
}

// dockerfile builds an image of the static binary offline: FROM scratch,
// nothing to pull.
const dockerfile = `# Image of ticketingd for compose.yaml, written by WRITTEN_BY.
# It builds offline (no base image to pull, no network): put a static
# binary named ticketingd beside this file first, built in a clone of the
# repository with
#
#   CGO_ENABLED=0 go build -o /path/to/this/bundle/ticketingd ./cmd/ticketingd
#
# .dockerignore keeps everything else (keys, tokens) out of the build.
FROM scratch
COPY ticketingd /usr/local/bin/ticketingd
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ticketingd"]
CMD ["serve", "--config", "/etc/ticketingd/ticketingd.yaml", "--data-dir", "/var/lib/ticketingd"]
`

// ComposeService is a service of a bundle's compose.yaml.
type ComposeService struct {
	Build           string   `yaml:"build"`
	Image           string   `yaml:"image"`
	NetworkMode     string   `yaml:"network_mode"`
	User            string   `yaml:"user"`
	Command         []string `yaml:"command"`
	Volumes         []string `yaml:"volumes"`
	Restart         string   `yaml:"restart"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
	ReadOnly        bool     `yaml:"read_only"`
}

// ComposeProject is a bundle's compose.yaml.
type ComposeProject struct {
	Services map[string]ComposeService `yaml:"services"`
}

// composeUser runs the containers as the owner of the bundle's files,
// which are mode 0600.
const composeUser = "${TICKETING_UID:?export TICKETING_UID=the owner of the bundle files (id -u)}:${TICKETING_GID:?export TICKETING_GID=their group (id -g)}"

// compose plans compose.yaml: a service per node on the host's network,
// so that the configs' addresses hold as they are, with the node's files
// mounted read-only and its data directory read-write.
func (p *planner) compose() ([]byte, error) {
	proj := ComposeProject{Services: map[string]ComposeService{}}
	for _, r := range p.node {
		name := r.id
		if name == "" {
			name = "ticketingd"
		}
		svc := ComposeService{Build: ".", Image: "ticketingd:local", NetworkMode: "host", User: composeUser,
			Command:         []string{"serve", "--config", containerConfig + "/" + ConfigFile, "--data-dir", containerData},
			Restart:         "on-failure",
			StopGracePeriod: "15s",
			ReadOnly:        true,
		}
		for _, f := range r.files {
			svc.Volumes = append(svc.Volumes, "./"+path.Join(r.dir, f)+":"+containerConfig+"/"+f+":ro")
		}
		if p.s.TLS == TLSOwn {
			for _, f := range []string{p.s.OwnTLS.CertFile, p.s.OwnTLS.KeyFile} {
				svc.Volumes = append(svc.Volumes, f+":"+f+":ro")
			}
		}
		svc.Volumes = append(svc.Volumes, "./"+path.Join(r.dir, DataDir)+":"+containerData)
		proj.Services[name] = svc
	}
	var buf bytes.Buffer
	buf.WriteString("# Docker Compose file of the bundle, written by " + p.writtenBy("") + ": a service per\n" +
		"# node on the host's network (the configs' addresses as they are). Build the image\n" +
		"# and start: see README.md. The containers run as the owner of the bundle files.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(proj); err != nil {
		return nil, fmt.Errorf("deploy: encode compose.yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("deploy: encode compose.yaml: %w", err)
	}
	return buf.Bytes(), nil
}

// readme is the bundle's README.md: its files, how to start it plainly,
// under systemd and Docker Compose, and how a Go client connects. It
// holds no secret: the line that sets the client URL reads the token from
// the tokens file.
func (p *planner) readme() string {
	var w strings.Builder
	what := map[Topology]string{Single: "a single ticketingd server", Pair: "a hot-standby pair of ticketingd servers",
		Cluster: fmt.Sprintf("a Raft cluster of %d ticketingd nodes", len(p.node))}[p.s.Topology]
	by := "`ticketingd init`"
	if p.s.Frontend != "" {
		by = p.s.Frontend
	}
	fmt.Fprintf(&w, "# Ticketing deployment\n\nThis bundle deploys %s. It was written by %s.\n", what, by)
	w.WriteString("Files of mode 0600 hold private keys or tokens: keep them so, and out of\nrepositories.\n\n")
	w.WriteString("| File | Mode |\n|---|---|\n")
	for _, f := range p.b.Files {
		if f.Mode.IsDir() {
			continue
		}
		fmt.Fprintf(&w, "| `%s` | %04o |\n", f.Path, f.Mode.Perm())
	}
	fmt.Fprintf(&w, "| `%s` | 0644 |\n", ReadmeFile)

	w.WriteString("\n## Start it plainly\n\n")
	if len(p.node) > 1 && !p.l.loopback {
		w.WriteString("Copy each node's directory to its machine (the CA keys stay here), then on each:\n\n```sh\n")
	} else {
		w.WriteString("In this directory:\n\n```sh\n")
	}
	for _, r := range p.node {
		fmt.Fprintf(&w, "ticketingd serve --config %s\n", path.Join(r.dir, ConfigFile))
	}
	w.WriteString("```\n\nPaths in a config are relative to the config file.\n")

	w.WriteString("\n## Start it under systemd\n\n")
	fmt.Fprintf(&w, "Each unit runs `%s` as the user `%s`, with its config in\n`%s` and its data directory as systemd's StateDirectory. With a static `ticketingd`\nbinary in this directory (built as for Docker Compose below), on each machine, as root:\n\n```sh\n",
		InstallBinary, ServiceUser, InstallConfig)
	fmt.Fprintf(&w, "install -m 0755 ticketingd %s\n", InstallBinary)
	fmt.Fprintf(&w, "useradd --system --no-create-home --shell /usr/sbin/nologin %s\n", ServiceUser)
	for _, r := range p.node {
		if r.id != "" {
			fmt.Fprintf(&w, "# node %s\n", r.id)
		}
		fmt.Fprintf(&w, "install -d -m 0700 -o %s -g %s %s\n", ServiceUser, ServiceUser, installDir(r))
		for _, f := range r.files {
			mode := "0600"
			if i := slices.IndexFunc(p.b.Files, func(x File) bool { return x.Path == path.Join(r.dir, f) }); i >= 0 && !p.b.Files[i].Secret {
				mode = "0644"
			}
			fmt.Fprintf(&w, "install -m %s -o %s -g %s %s %s/\n", mode, ServiceUser, ServiceUser, path.Join(r.dir, f), installDir(r))
		}
		fmt.Fprintf(&w, "install -m 0644 %s /etc/systemd/system/\n", unitFile(r))
	}
	w.WriteString("systemctl daemon-reload\n")
	for _, r := range p.node {
		fmt.Fprintf(&w, "systemctl enable --now %s\n", path.Base(unitFile(r)))
	}
	w.WriteString("```\n")
	if p.s.TLS == TLSOwn {
		fmt.Fprintf(&w, "\nYour own certificate and key (%s, %s) must be readable by the user `%s`.\n", p.s.OwnTLS.CertFile, p.s.OwnTLS.KeyFile, ServiceUser)
	}

	w.WriteString("\n## Start it with Docker Compose\n\n")
	w.WriteString("The image holds only the static binary (`FROM scratch`): it builds offline. In a\n" +
		"clone of the repository, build the binary into this directory, then here:\n\n```sh\n")
	w.WriteString("CGO_ENABLED=0 go build -o /path/to/this/bundle/ticketingd ./cmd/ticketingd\n")
	w.WriteString("export TICKETING_UID=$(id -u) TICKETING_GID=$(id -g)   # the owner of these files\n")
	w.WriteString("docker compose build\ndocker compose up -d\n```\n\n")
	w.WriteString("The services use the host's network, so the configs' addresses hold as they are.\n")
	if len(p.node) > 1 && !p.l.loopback {
		w.WriteString("On a machine of one node, start only its service: `docker compose up -d ID`.\n")
	}

	if p.s.Kubernetes != nil {
		w.WriteString(p.kubeReadme())
	}

	w.WriteString("\n## Connect from Go\n\nGive each client the URL through its environment. ")
	pre, rest, ok := "", "", false
	if len(p.tok) > 0 && len(p.node) > 0 {
		pre, rest, ok = strings.Cut(p.b.URL, p.tok[0]+"@")
	}
	if ok {
		// The URL with the first token of client-tokens, read from the
		// file when the line runs: usable as it is, in this directory,
		// and no secret in this file.
		tokens := path.Join(p.node[0].dir, TokensFile)
		fmt.Fprintf(&w, "In this directory, this line sets it\nwith the first token of `%s` (its lines starting with # are comments):\n\n```sh\n", tokens)
		fmt.Fprintf(&w, "export TICKETING_URL=\"%s$(grep -m 1 -v -e '^#' -e '^[[:space:]]*$' %s)@\"%s\n```\n", pre, ShellQuote(tokens), ShellQuote(rest))
		fmt.Fprintf(&w, "\nElsewhere, put a token of `%s` in place of `TOKEN`: `%s`.\n", tokens, pre+"TOKEN@"+rest)
	} else {
		fmt.Fprintf(&w, "\n\n```sh\nexport TICKETING_URL='%s'\n```\n", p.b.URL)
	}
	fmt.Fprintf(&w, "\n```go\n%s```\n", goSnippet)
	return w.String()
}
