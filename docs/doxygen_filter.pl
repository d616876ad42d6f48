#!/usr/bin/perl
# Doxygen input filter (docs/Doxyfile): the public headers document with
# plain // comments. This makes them doc comments for the reference. The
# headers themselves stay as they are; every output line is one input line,
# so Doxygen's warnings point at the header's real line numbers.
#
#  - The comment block a header opens with describes the file.
#  - A comment block right before a declaration (no blank line between)
#    describes it; a comment after `;` or `,` on the same line describes that
#    member, and `//` lines right below it, at the same column, continue it.
#  - A declaration of several members (`int64_t lo = 0, hi = 0;`) gives the
#    comment to every one of them, not only to the first or the last.
#  - A block that starts with a rule (`// -----`) and is followed by a blank
#    line is a section of the file's description, unless it is a title only
#    (one line of text); any other block followed by a blank line
#    (`// --- Groups ---`) is a plain comment, not documentation. Rule lines
#    themselves never become text.
#  - Lines indented two spaces or more past `// ` (examples, tables, file
#    formats) come out verbatim, as laid out in the header; not those that
#    continue a `- ` item or a line ending in a comma.
# Characters Doxygen reads as commands or HTML are escaped, so the text comes
# out as written.
use strict;
use warnings;

sub text { my $t = shift; $t =~ s/([\\@#<>&%\$])/\\$1/g; return $t; }

my @lines = <>;
my $n = @lines;

sub is_comment { return $_[0] =~ m{^\s*//(?: |$)}; }
sub comment_text { my ($l) = @_; $l =~ m{^\s*//(?: (.*))?$}; return defined $1 ? $1 : ""; }
sub is_rule { return $_[0] =~ m{^\s*//\s*-{10,}\s*$}; }
sub is_blank { return $_[0] =~ m{^\s*$}; }

# The member names of a declaration of two or more members
# ("std::atomic<int> a{0}, b{0};", "int64_t lo = 0, hi = 0;"), else ().
sub declarators {
  my ($code) = @_;
  return () unless $code =~ m{^\s*(?:(?:static|const|constexpr|mutable|inline)\s+)*
                               [A-Za-z_][\w:]*(?:<[^;]*?>)?\s+(?!operator\b)(.*);\s*$}x;
  my $rest = $1;
  return () if $code =~ m{^\s*(?:return|using|typedef|friend|delete|throw|case|goto|namespace|class|struct|enum|template)\b};
  my @parts;
  my ($depth, $cur) = (0, "");
  for my $c (split //, $rest) {
    if ($c =~ /[<({\[]/) { $depth++; }
    elsif ($c =~ /[>)}\]]/) { $depth--; }
    if ($c eq ',' && $depth == 0) { push @parts, $cur; $cur = ""; next; }
    $cur .= $c;
  }
  push @parts, $cur;
  return () if @parts < 2;
  my @names;
  for my $p (@parts) {
    return () unless $p =~ m{^\s*(\w+)\s*(?:=[^=].*|\{.*\}|\[.*\])?\s*$};
    push @names, $1;
  }
  return @names;
}

# `\var NAME` blocks on one line (\ilinebr ends the declaration).
sub var_docs {
  my ($doc, @names) = @_;
  $doc =~ s{\*/}{*\\/}g;
  return join(" ", map { "/** \\var $_ \\ilinebr $doc */" } @names);
}

# The doc comment lines for comment lines @$ls (one output line each).
# `$prefix` goes before the first line's text, `$suffix` after the first
# line's. Lines indented by two spaces or more past `// ` (code examples,
# tables, formats) are kept verbatim, unless they continue a `- ` list item
# or a line that ends with a comma (a wrapped list: `defines: A, B,`).
sub doc_lines {
  my ($ls, $prefix, $suffix) = @_;
  my @t = map { is_rule($_) ? "" : comment_text($_) } @$ls;
  my @verb = (0) x @t;
  my $in_item = 0;
  for my $m (0 .. $#t) {
    if ($t[$m] =~ /^ {2,}\S/) { $verb[$m] = !$in_item; }
    else { $in_item = $t[$m] =~ /^- |,\s*$/; }
  }
  my @body = map { $verb[$_] ? $t[$_] : text($t[$_]) } 0 .. $#t;
  # A run opens at the end of the line before it, so that every line of the
  # run keeps its indentation (Doxygen trims the text after the command);
  # \code, not \verbatim: Doxygen 1.9.4's Markdown pass mistakes a second
  # \verbatim in one comment after a blank line for the end of a block.
  for my $m (0 .. $#t) {
    next unless $verb[$m] && ($m == 0 || !$verb[$m - 1]);
    if ($m > 0 && !($m == 1 && ($prefix ne "" || $suffix ne ""))) {
      $body[$m - 1] .= ($body[$m - 1] eq "" ? "" : " ") . "\\code{.unparsed}";
    } else {
      $body[$m] = "\\code{.unparsed}" . $body[$m];
    }
  }
  for my $m (0 .. $#t) {
    $body[$m] .= " \\endcode" if $verb[$m] && ($m == $#t || !$verb[$m + 1]);
  }
  $body[0] = "$prefix$body[0]$suffix" if @body;
  my @out;
  for my $m (0 .. $#t) {
    my ($indent) = $ls->[$m] =~ m{^(\s*)};
    push @out, "$indent/// $body[$m]\n";
  }
  return @out;
}

my $i = 0;

# The head block: the file's description.
if ($n && is_comment($lines[0])) {
  my $j = 0;
  $j++ while $j < $n && is_comment($lines[$j]);
  print doc_lines([@lines[0 .. $j - 1]], "", " \\file");
  $i = $j;
}

my $trail_col = -1;   # column of the `//` of the last line's trailing comment
my $pending = undef;  # text of the block right before the current line

while ($i < $n) {
  my $line = $lines[$i];
  if (is_comment($line)) {
    # A run of comment lines: continuation, section, plain or documentation.
    my $j = $i;
    $j++ while $j < $n && is_comment($lines[$j]);
    my $next = $j < $n ? $lines[$j] : "";
    my $k = $i;
    if ($trail_col >= 0) {
      while ($k < $j && index($lines[$k], "//") == $trail_col && $lines[$k] =~ m{^\s*//}) {
        print " " x $trail_col . "///< " . text(comment_text($lines[$k])) . "\n";
        $k++;
      }
    }
    $trail_col = -1;
    my $detached = $j >= $n || is_blank($next);
    my $section = $j - $k > 2 && $detached && is_rule($lines[$k]);
    $pending = undef;
    if ($k < $j && $section) {
      my ($indent) = $lines[$k] =~ m{^(\s*)};
      print "$indent/// \\file\n";
      print doc_lines([@lines[$k + 1 .. $j - 1]], "\\details ", "");
    } elsif ($k < $j && $detached) {
      print @lines[$k .. $j - 1];
    } elsif ($k < $j) {
      # A rule before the text is no text; the rest documents what follows.
      my $r = $k;
      print $lines[$r++] while $r < $j && is_rule($lines[$r]);
      if ($r < $j) {
        my @ls = @lines[$r .. $j - 1];
        print doc_lines(\@ls, "", "");
        my @doc = grep { $_ ne "" } map { text(comment_text($_)) } @ls;
        $pending = join(" ", @doc) if @doc;
      }
    }
    $i = $j;
    next;
  }
  chomp $line;
  if ($line =~ m{^(.*?[;,])(\s*)// (.*)$}) {
    my ($code, $gap, $t) = ($1, $2, text($3));
    $trail_col = length($code) + length($gap);
    my @names = declarators($code);
    if (@names) {
      print "$code " . var_docs($t, @names) . "\n";
    } else {
      print "$code ///< $t\n";
    }
  } else {
    $trail_col = -1;
    my @names = defined $pending ? declarators($line) : ();
    if (@names) {
      shift @names;  # the block above documents the first one
      print "$line " . var_docs($pending, @names) . "\n";
    } else {
      print "$line\n";
    }
  }
  $pending = undef;
  $i++;
}
