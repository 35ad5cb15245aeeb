package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// shellWords are the shell's own commands, completed like QMP commands.
var shellWords = []string{"help", "hmp", "quit"}

// qmpShell runs the interactive shell: a line editor with history and completion on a terminal,
// plain line reading otherwise. Piped input exits 1 when any command failed.
func (e *env) qmpShell(ctx context.Context, cmd *cobra.Command, q *qmpClient) error {
	names := qmpCommandNames(ctx, q)
	f, ok := cmd.InOrStdin().(*os.File)
	if ok && term.IsTerminal(int(f.Fd())) {
		return terminalShell(ctx, f, cmd.OutOrStdout(), q, names)
	}
	return pipedShell(ctx, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), q, names)
}

// qmpCommandNames asks query-commands; without it the shell still works, just without completion.
func qmpCommandNames(ctx context.Context, q *qmpClient) []string {
	ret, err := q.Execute(ctx, "query-commands", nil)
	if err != nil {
		return nil
	}
	var cmds []struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(ret, &cmds) != nil {
		return nil
	}
	names := make([]string, 0, len(cmds))
	for _, c := range cmds {
		names = append(names, c.Name)
	}
	sort.Strings(names)
	return names
}

func terminalShell(ctx context.Context, f *os.File, out io.Writer, q *qmpClient, names []string) error {
	old, err := term.MakeRaw(int(f.Fd()))
	if err != nil {
		return fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	defer term.Restore(int(f.Fd()), old)
	t := term.NewTerminal(struct {
		io.Reader
		io.Writer
	}{f, out}, "(qmp) ")
	t.AutoCompleteCallback = completer(append(slices.Clone(shellWords), names...), t)
	fmt.Fprintln(t, "QMP shell. Tab completes command names; 'help' lists them; 'quit' or Ctrl+D leaves.")
	stop := make(chan struct{})
	defer close(stop)
	go printEvents(q, t, stop)
	for {
		line, err := t.ReadLine()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read command: %w", err)
		}
		quit, err := shellLine(ctx, q, line, t, names)
		if err != nil {
			fmt.Fprintln(t, FormatError(err))
			if q.closed() {
				return err
			}
		}
		if quit {
			return nil
		}
	}
}

func pipedShell(ctx context.Context, in io.Reader, out, errOut io.Writer, q *qmpClient, names []string) error {
	stop := make(chan struct{})
	defer close(stop)
	go printEvents(q, errOut, stop)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	failed := 0
	for sc.Scan() {
		quit, err := shellLine(ctx, q, sc.Text(), out, names)
		if err != nil {
			failed++
			fmt.Fprintln(errOut, FormatError(err))
			if q.closed() {
				return err
			}
		}
		if quit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read commands: %w", err)
	}
	if failed > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d QMP command(s) failed", failed)}
	}
	return nil
}

// printEvents shows QMP events as they come until stop closes.
func printEvents(q *qmpClient, w io.Writer, stop chan struct{}) {
	for {
		select {
		case ev := <-q.events:
			fmt.Fprintf(w, "event: %s\n", ev.raw)
		case <-stop:
			return
		}
	}
}

func (q *qmpClient) closed() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// shellLine runs one shell line: COMMAND [JSON-ARGS], a raw {"execute": ...} object, hmp TEXT,
// help or quit.
func shellLine(ctx context.Context, q *qmpClient, line string, w io.Writer, names []string) (bool, error) {
	line = strings.TrimSpace(line)
	word, rest, _ := strings.Cut(line, " ")
	switch word {
	case "":
		return false, nil
	case "quit", "exit":
		return true, nil
	case "help":
		fmt.Fprintf(w, "COMMAND [JSON-ARGS] | {\"execute\": ..., \"arguments\": {...}} | hmp TEXT | quit\ncommands: %s\n", strings.Join(names, " "))
		return false, nil
	case "hmp":
		text, err := hmpText(ctx, q, rest)
		if err != nil {
			return false, qmpFailure("human-monitor-command", err)
		}
		_, err = io.WriteString(w, text)
		return false, err
	}
	command, args, err := shellCommand(line)
	if err != nil {
		return false, err
	}
	ret, err := q.Execute(ctx, command, args)
	if err != nil {
		return false, qmpFailure(command, err)
	}
	return false, printJSON(w, ret)
}

// shellCommand parses COMMAND [JSON-ARGS] or a whole QMP request object.
func shellCommand(line string) (string, json.RawMessage, error) {
	if strings.HasPrefix(line, "{") {
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(line), &req); err != nil {
			return "", nil, fmt.Errorf("request %q: %w", truncate([]byte(line), 80), err)
		}
		if err := checkCommandName(req.Execute); err != nil {
			return "", nil, fmt.Errorf("request's execute: %w", err)
		}
		args, err := parseJSONArgs(string(req.Arguments))
		if err != nil {
			return "", nil, fmt.Errorf("arguments of %s: %w", req.Execute, err)
		}
		return req.Execute, args, nil
	}
	word, rest, _ := strings.Cut(line, " ")
	words := []string{word}
	if strings.TrimSpace(rest) != "" {
		words = append(words, rest)
	}
	return parseQMPArgs(words)
}

// completer completes the first word of a line from names on Tab; when several match and none
// is longer than the common prefix, it lists them.
func completer(names []string, t *term.Terminal) func(string, int, rune) (string, int, bool) {
	return func(line string, pos int, key rune) (string, int, bool) {
		if key != '\t' {
			return "", 0, false
		}
		prefix := line[:pos]
		if strings.ContainsRune(prefix, ' ') {
			return "", 0, false
		}
		matches := completions(names, prefix)
		switch {
		case len(matches) == 0:
			return "", 0, false
		case len(matches) == 1:
			return matches[0] + " " + line[pos:], len(matches[0]) + 1, true
		}
		common := commonPrefix(matches)
		if len(common) > len(prefix) {
			return common + line[pos:], len(common), true
		}
		fmt.Fprintln(t, strings.Join(matches, "  "))
		return "", 0, false
	}
}

func completions(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func commonPrefix(ss []string) string {
	p := ss[0]
	for _, s := range ss[1:] {
		for !strings.HasPrefix(s, p) {
			p = p[:len(p)-1]
		}
	}
	return p
}
