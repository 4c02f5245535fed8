package config

import (
	"os"
	"strings"
	"testing"
)

// docExample returns the YAML block of docs/config.md that follows "This is
// a complete file".
func docExample(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "This is a complete file")
	if i < 0 {
		t.Fatal("docs/config.md: no complete example")
	}
	s = s[i:]
	start := strings.Index(s, "```yaml\n")
	if start < 0 {
		t.Fatal("docs/config.md: no yaml block after the complete example's sentence")
	}
	s = s[start+len("```yaml\n"):]
	end := strings.Index(s, "```")
	return []byte(s[:end])
}

func TestDocExampleIsValid(t *testing.T) {
	c, err := parse("policy.yaml", docExample(t))
	if err != nil {
		t.Fatalf("the documented example does not load:\n%v", err)
	}
	for _, w := range c.Warnings {
		t.Errorf("the documented example warns: %s", w)
	}
	if len(c.Dependencies) != 5 || len(c.Servers) != 1 {
		t.Fatalf("got %d dependencies and %d servers; want 5 and 1", len(c.Dependencies), len(c.Servers))
	}
}
