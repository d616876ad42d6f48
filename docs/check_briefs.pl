#!/usr/bin/perl
# Checks Doxygen's XML output (docs/Doxyfile: GENERATE_XML) for public names
# without a brief description: every class, struct, union, namespace and
# header, and every public member that made it into the reference. Doxygen's
# own WARN_IF_UNDOCUMENTED misses a class with no members of its own (an
# exception class that only inherits its constructors, say): it is listed in
# the reference with an empty description and no warning. Prints one line per
# name and exits 1 when there is one. Not checked, as Doxygen does not ask for
# them either: destructors, deleted and defaulted functions, friends, enum
# values, the std namespace, libtorch's namespaces and the Markdown pages.
#   perl docs/check_briefs.pl build/docs/xml
use strict;
use warnings;

my $dir = shift // die "usage: check_briefs.pl XML_DIR\n";
opendir(my $dh, $dir) or die "check_briefs.pl: cannot read $dir: $! (run doxygen docs/Doxyfile first)\n";
my @files = sort grep { /\.xml$/ && $_ ne "index.xml" } readdir $dh;
closedir $dh;
die "check_briefs.pl: no Doxygen XML in $dir\n" unless @files;

sub text_of {
  my $t = shift;
  $t =~ s/<[^>]*>//g;
  $t =~ s/\s+//g;
  return $t;
}

my @missing;
my $checked = 0;
for my $f (@files) {
  open(my $fh, "<", "$dir/$f") or die "check_briefs.pl: cannot read $dir/$f: $!\n";
  local $/;
  my $xml = <$fh>;
  close $fh;
  while ($xml =~ m{<compounddef\b([^>]*)>(.*?)</compounddef>}gs) {
    my ($attrs, $body) = ($1, $2);
    my ($kind) = $attrs =~ /\bkind="([^"]*)"/;
    next unless $kind =~ /^(class|struct|union|namespace|file)$/;
    next if $attrs =~ /\bprot="(private|protected)"/;
    my ($name) = $body =~ m{<compoundname>(.*?)</compoundname>};
    next if $name eq "std" || $name =~ /^std::/ || ($kind eq "file" && $name =~ /\.md$/);
    # libtorch's namespaces: Doxygen lists them as the place of a base class
    # (fsdp::FusedAdamW's torch::optim::AdamW); they are not ours to describe.
    next if $kind eq "namespace" && $name =~ /^(torch|c10|at)(::|$)/;
    # The compound's own brief is the first one outside its members.
    (my $own = $body) =~ s{<memberdef\b.*?</memberdef>}{}gs;
    $own =~ s{<innerclass\b.*?</innerclass>}{}gs;
    my ($brief) = $own =~ m{<briefdescription>(.*?)</briefdescription>}s;
    $checked++;
    push @missing, "$kind $name" unless defined $brief && text_of($brief) ne "";
    while ($body =~ m{<memberdef\b([^>]*)>(.*?)</memberdef>}gs) {
      my ($mattrs, $mbody) = ($1, $2);
      next unless $mattrs =~ /\bprot="public"/;
      my ($mkind) = $mattrs =~ /\bkind="([^"]*)"/;
      next if $mkind eq "friend";
      $mbody =~ s{<enumvalue\b.*?</enumvalue>}{}gs;
      my ($mname) = $mbody =~ m{<name>(.*?)</name>};
      my ($args) = $mbody =~ m{<argsstring>(.*?)</argsstring>}s;
      $args //= "";
      $args =~ s/&amp;/&/g; $args =~ s/&lt;/</g; $args =~ s/&gt;/>/g;
      next if $mname =~ /^~/ || $args =~ /=\s*(delete|default)\s*$/;
      my ($mbrief) = $mbody =~ m{<briefdescription>(.*?)</briefdescription>}s;
      $checked++;
      push @missing, "$mkind $name" . ($kind eq "file" ? ": " : "::") . $mname . $args
        unless defined $mbrief && text_of($mbrief) ne "";
    }
  }
}

my %seen;
@missing = grep { !$seen{$_}++ } @missing;
if (@missing) {
  print "No brief description (a // comment right above it in the header):\n";
  print "  $_\n" for @missing;
  exit 1;
}
print "check_briefs.pl: $checked names, each with a brief\n";
