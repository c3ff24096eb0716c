# Splits one unit of Redis's test suite into one unit per top-level block,
# so that the suite's clients run its blocks side by side:
#
#   tclsh split_unit.tcl <tests dir> <unit>      e.g. tests integration/replication
#
# writes tests/<unit>.partNN.tcl and prints the new units' names, one a line.
# A block is a top-level `start_server`, `test`, `foreach` or `if`: each
# starts its own servers, so none depends on another. Every other top-level
# command (the unit's procs and variables) goes into every part, before its
# block. The copy is made at run time in target/; the stored suite is never
# changed.
lassign $argv dir unit
set in [open [file join $dir $unit.tcl]]
set source [read $in]
close $in

set shared {}
set blocks {}
set command ""
foreach line [split $source "\n"] {
    append command $line "\n"
    if {![info complete $command]} continue
    set words [string trim $command]
    if {$words ne "" && [string index $words 0] ne "#"} {
        if {[lindex $words 0] in {start_server test foreach if}} {
            lappend blocks $command
        } else {
            append shared $command
        }
    }
    set command ""
}
if {[string trim $command] ne ""} {
    error "$unit.tcl ends inside an unfinished command"
}

set index 0
foreach block $blocks {
    incr index
    set part [format "%s.part%02d" $unit $index]
    set out [open [file join $dir $part.tcl] w]
    puts $out "# Block $index of $unit.tcl, made by split_unit.tcl.\n"
    puts -nonewline $out $shared
    puts -nonewline $out $block
    close $out
    puts $part
}
