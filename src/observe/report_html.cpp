// fsdp-cpp: the report page (fsdp::report::write_html).
//
// One HTML file with its data, styles and script inline: it must open from a
// file:// URL on a machine without network (a cluster login node), so nothing
// is fetched. The script draws inline SVG from the data model of analyze();
// it computes nothing the tests cannot check in C++ except layout, and it
// reports its own success: <body data-rendered="ok"> and an empty
// #fsdp-errors when every section drew (the headless-browser test reads both).
#include <fstream>

#include "fsdp/errors.h"
#include "fsdp/trace.h"

namespace fsdp::report {
namespace {

const char* kTemplate = R"FSDPHTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root{--bg:#f6f7f9;--card:#fff;--ink:#1d2330;--mute:#667085;--line:#e4e7ec;
--ag:#3b82f6;--fwd:#22a06b;--bwd:#f59e0b;--opt:#8b5cf6;--rs:#e5484d;--ar:#c2185b;--ckpt:#d4a017;--other:#94a3b8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Liberation Sans",sans-serif}
header{background:linear-gradient(135deg,#1e293b,#334155);color:#fff;padding:22px 32px 18px}
header h1{margin:0;font-size:22px;font-weight:650;letter-spacing:.2px}
header .sub{color:#cbd5e1;margin-top:4px;font-size:13px}
main{max-width:1320px;margin:0 auto;padding:18px 24px 40px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px;margin-bottom:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.card .k{color:var(--mute);font-size:12px;text-transform:uppercase;letter-spacing:.5px}
.card .v{font-size:21px;font-weight:650;margin-top:2px}
.card .n{color:var(--mute);font-size:12px;margin-top:2px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px;margin-bottom:16px}
section h2{margin:0 0 2px;font-size:17px}
section p.lead{margin:0 0 10px;color:var(--mute);font-size:13px}
svg{display:block;max-width:100%;height:auto}
svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Liberation Sans",sans-serif;fill:var(--ink)}
svg .mute{fill:var(--mute)}
svg .axis line,svg .grid line{stroke:var(--line)}
svg.hl [data-unit]{opacity:.22}
svg.hl [data-unit].on{opacity:1}
.legend{display:flex;flex-wrap:wrap;gap:6px 14px;margin:8px 0 0;font-size:12px;color:var(--mute)}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.btns{display:flex;flex-wrap:wrap;gap:6px;margin:0 0 10px}
.btns button{border:1px solid var(--line);background:#fff;border-radius:6px;padding:3px 10px;font:inherit;font-size:12px;cursor:pointer}
.btns button.on{background:#1e293b;color:#fff;border-color:#1e293b}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{text-align:right;padding:4px 8px;border-bottom:1px solid var(--line);white-space:nowrap}
th{color:var(--mute);font-weight:600}
th:first-child,td:first-child,td.l,th.l{text-align:left}
.eq{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;background:#f1f5f9;border-radius:6px;padding:8px 10px;font-size:12.5px;margin-top:10px;white-space:pre-wrap}
.warn{background:#fff7ed;border:1px solid #fed7aa;color:#9a3412;border-radius:8px;padding:8px 12px;margin-bottom:14px;font-size:13px}
#fsdp-errors:empty{display:none}
#fsdp-errors{background:#fef2f2;border:1px solid #fecaca;color:#991b1b;border-radius:8px;padding:8px 12px;margin-bottom:14px;white-space:pre-wrap;font-size:13px}
.ok{color:#15803d}.bad{color:#b91c1c}
footer{color:var(--mute);font-size:12px;text-align:center;margin-top:10px}
</style></head>
<body>
<header><h1>__TITLE__</h1><div class="sub" id="sub"></div></header>
<main>
<pre id="fsdp-errors"></pre>
<div id="warnings"></div>
<div class="cards" id="cards"></div>
<section id="sec-map"><h2>Shard map</h2>
<p class="lead">What each rank holds between steps. Heights are to scale (bytes). Rank r owns elements [r&middot;S, (r+1)&middot;S) of every unit's flat buffer; the all-gather (AG) rebuilds a unit for its forward and backward, the reduce-scatter (RS) hands each rank the sum of its slice of the gradients. Hover a slice for its parameters.</p>
<div id="map"></div><div class="legend" id="map-legend"></div><div class="eq" id="ledger-eq"></div></section>
<section id="sec-timeline"><h2>Step timeline</h2>
<p class="lead">Per rank: all-gathers (AG), compute (forward, backward, optimizer) and reduce-scatters / all-reduces (RS). Hover a span for its unit, duration and bytes.</p>
<div class="btns" id="step-btns"></div><div id="timeline"></div>
<div class="legend"><span><i style="background:var(--ag)"></i>all-gather</span><span><i style="background:var(--fwd)"></i>forward</span><span><i style="background:var(--bwd)"></i>backward</span><span><i style="background:var(--opt)"></i>optimizer</span><span><i style="background:var(--rs)"></i>reduce-scatter</span><span><i style="background:var(--ar)"></i>all-reduce / other collectives</span><span><i style="background:var(--ckpt)"></i>checkpoint</span></div></section>
<section id="sec-memory"><h2>Memory per rank</h2>
<p class="lead">Bytes held by tensors (the counting allocator), sampled at each span end, against the ledger's predictions: resting (P+G+O)/N and peak P/N + P_block + A.</p>
<div id="memory"></div><div class="legend" id="memory-legend"></div></section>
<section id="sec-traffic"><h2>Traffic per step</h2>
<p class="lead">Bytes each rank sent per optimizer step (from the collectives' spans), against FULL_SHARD's 3P&middot;(N&minus;1)/N and SHARD_GRAD_OP / DDP's 2P&middot;(N&minus;1)/N.</p>
<div id="traffic"></div><div class="legend"><span><i style="background:var(--ag)"></i>all-gather</span><span><i style="background:var(--rs)"></i>reduce-scatter</span><span><i style="background:var(--ar)"></i>all-reduce</span><span><i style="background:var(--other)"></i>other</span></div>
<div id="traffic-table" style="margin-top:10px"></div></section>
<section id="sec-ckpt"><h2>Checkpoints</h2><div id="ckpt"></div></section>
<section id="sec-units"><h2>Units</h2><p class="lead">FSDP units in flat-buffer order: each is all-gathered and reduce-scattered as one.</p><div id="units"></div></section>
<footer id="status"></footer>
</main>
<script type="application/json" id="fsdp-data">__DATA__</script>
<script>
(function(){
"use strict";
var errBox=document.getElementById("fsdp-errors");
function fail(where,e){errBox.textContent+=where+": "+(e&&e.stack?e.stack:e)+"\n";}
window.addEventListener("error",function(ev){fail("script error",ev.message+" ("+ev.lineno+":"+ev.colno+")");});
var D;
try{D=JSON.parse(document.getElementById("fsdp-data").textContent);}catch(e){fail("data",e);return;}
var SVGNS="http://www.w3.org/2000/svg";
function S(tag,attrs,parent){var e=document.createElementNS(SVGNS,tag);for(var k in attrs)e.setAttribute(k,attrs[k]);if(parent)parent.appendChild(e);return e;}
function SV(parent,W,H,label){return S("svg",{viewBox:"0 0 "+W+" "+H,width:W,height:H,role:"img","aria-label":label},parent);}
function T(parent,x,y,text,attrs){var t=S("text",Object.assign({x:x,y:y},attrs||{}),parent);t.textContent=text;return t;}
function tip(e,text){var t=S("title",{},e);t.textContent=text;return e;}
function H(tag,attrs,text){var e=document.createElement(tag);for(var k in attrs||{})e.setAttribute(k,attrs[k]);if(text!=null)e.textContent=text;return e;}
function fb(b){if(b==null||isNaN(b))return "–";var a=Math.abs(b),u=["B","KiB","MiB","GiB","TiB"],i=0;while(a>=1024&&i<4){a/=1024;b/=1024;i++;}return (i?b.toFixed(Math.abs(b)<10?2:1):Math.round(b))+" "+u[i];}
function fn(n){if(n==null)return "–";if(n>=1e9)return (n/1e9).toFixed(2)+" G";if(n>=1e6)return (n/1e6).toFixed(2)+" M";if(n>=1e4)return (n/1e3).toFixed(1)+" k";return String(Math.round(n));}
function fms(t){return t>=1000?(t/1000).toFixed(2)+" s":t>=10?t.toFixed(1)+" ms":t.toFixed(2)+" ms";}
function hue(i){return (i*137.508+200)%360;}
function ucol(i,l){return "hsl("+hue(i).toFixed(0)+",62%,"+(l||58)+"%)";}
function uname(u){return u.name===""||u.name==null?"<root>":u.name;}
function nice(max,n){var raw=max/n,p=Math.pow(10,Math.floor(Math.log10(raw||1))),m=raw/p;var s=m<=1?1:m<=2?2:m<=2.5?2.5:m<=5?5:10;return s*p;}
function niceBytes(max,n){var p=1;while(p*1024<=max/n)p*=1024;var r=(max/n)/p,s=r<=1?1:r<=2?2:r<=2.5?2.5:r<=5?5:r<=10?10:r<=20?20:r<=25?25:r<=50?50:r<=100?100:r<=200?200:r<=250?250:500;return s*p;}
var ranks=D.ranks||[],N=D.world||ranks.length,units=D.units||[];
var led0=(ranks[0]&&ranks[0].meta&&ranks[0].meta.ledger)||null;
var rendered=[];
function section(name,fn){try{fn();rendered.push(name);}catch(e){fail(name,e);}}

section("header",function(){
  var m=ranks[0]?ranks[0].meta:{};var bits=[];
  if(D.model)bits.push(D.model);
  bits.push("world N = "+N);
  if(D.strategy)bits.push(D.strategy);
  if(D.optimizer)bits.push("optimizer "+D.optimizer);
  if(m.param_dtype)bits.push("param dtype "+m.param_dtype);
  bits.push("source: "+D.source);
  document.getElementById("sub").textContent=bits.join("  ·  ");
  var w=document.getElementById("warnings");
  (D.warnings||[]).forEach(function(x){w.appendChild(H("div",{"class":"warn"},"⚠ "+x));});
});

// ---- summary cards ----
var numel=0,padded=0;units.forEach(function(u){numel+=u.numel||0;padded+=u.padded_numel||u.numel||0;});
var mb=D.master_bytes_per_elem||4,k=D.optimizer_state_per_param;var kAssumed=(k==null);if(k==null)k=2;
var allSteps=[];ranks.forEach(function(r){(r.steps||[]).forEach(function(s){allSteps.push(s);});});
function mean(a){return a.length?a.reduce(function(x,y){return x+y;},0)/a.length:NaN;}
section("cards",function(){
  var c=document.getElementById("cards");
  function card(kk,v,n){var d=H("div",{"class":"card"});d.appendChild(H("div",{"class":"k"},kk));d.appendChild(H("div",{"class":"v"},v));if(n)d.appendChild(H("div",{"class":"n"},n));c.appendChild(d);}
  card("Parameters",numel?fn(numel):"–",numel?fb(numel*4)+" fp32 · "+units.length+" units":"no unit metadata");
  var peak=Math.max.apply(null,ranks.map(function(r){return r.peak||0;}).concat([0]));
  card("Peak memory (max rank)",peak?fb(peak):"–",led0&&led0.predicted_peak?"predicted "+fb(led0.predicted_peak)+" ("+(100*peak/led0.predicted_peak).toFixed(0)+"%)":"no ledger metadata");
  if(led0&&led0.predicted_rest)card("Resting per rank",fb(led0.predicted_rest),"(P+G+O)/N predicted");
  var tr=mean(allSteps.map(function(s){return s.total_bytes;}));
  var L=D.traffic_lines||{};var exp=D.strategy==="NO_SHARD"?L.ddp_2p:D.strategy==="SHARD_GRAD_OP"?L.grad_op_2p:L.full_3p;
  card("Traffic / step / rank",isNaN(tr)?"–":fb(tr),exp?"formula "+fb(exp)+(isNaN(tr)?"":" ("+(100*tr/exp).toFixed(1)+"%)"):"");
  var st=mean(allSteps.map(function(s){return s.t1-s.t0;}));
  card("Steps",String(ranks[0]?(ranks[0].steps||[]).length:0),isNaN(st)?"no step spans":"mean "+fms(st)+" per step");
  var nck=0;ranks.forEach(function(r){nck+=(r.ckpt||[]).length;});
  card("Checkpoint events",String(nck),nck?"save / load spans":"none recorded");
});

// ---- shard map ----
section("map",function(){
  var box=document.getElementById("map");
  if(!units.length){box.appendChild(H("p",{"class":"warn"},"No \"units\" metadata in the trace: the engine must call fsdp::trace::set_metadata(\"units\", ...) (see include/fsdp/trace.h)."));return;}
  var noShard=D.strategy==="NO_SHARD";
  var fullBytes=padded*mb;
  var rankP=noShard?fullBytes:fullBytes/N;
  var maxH=Math.max(fullBytes,rankP*Math.max(k,1));
  var H0=380,top=46,scale=H0/maxH;
  var fullW=130,barW=46,gap=10,colW=3*barW+2*gap,colGap=40,left=20,arrowW=120;
  var W=left+fullW+arrowW+N*colW+(N-1)*colGap+40;
  var svg=SV(box,W,(top+H0+40),"shard map");
  svg.addEventListener("mouseover",function(ev){var t=ev.target.closest&&ev.target.closest("[data-unit]");svg.querySelectorAll(".on").forEach(function(e){e.classList.remove("on");});if(t){svg.classList.add("hl");svg.querySelectorAll('[data-unit="'+t.getAttribute("data-unit")+'"]').forEach(function(e){e.classList.add("on");});}else svg.classList.remove("hl");});
  svg.addEventListener("mouseleave",function(){svg.classList.remove("hl");});
  // full model column
  T(svg,left+fullW/2,top-26,"Full model (unsharded)",{"text-anchor":"middle","font-weight":"600"});
  T(svg,left+fullW/2,top-12,fb(fullBytes)+" = P",{"text-anchor":"middle","class":"mute"});
  var y=top,ys=[];
  units.forEach(function(u,i){
    var h=(u.padded_numel||u.numel)*mb*scale;ys.push([y,h]);
    var g=S("g",{"data-unit":i},svg);
    tip(S("rect",{x:left,y:y,width:fullW,height:Math.max(h,0.5),fill:ucol(i),stroke:"#fff","stroke-width":h>3?1:0},g),
      uname(u)+"\n"+fn(u.numel)+" parameters ("+fn(u.padded_numel)+" padded)\nunsharded "+fb((u.padded_numel||u.numel)*(D.param_bytes_per_elem||4))+" · shard "+fn(u.shard_numel)+" elements per rank");
    if(h>=13)T(g,left+6,y+Math.min(h/2+4,14),uname(u),{fill:"#fff","font-weight":"600"});
    y+=h;
  });
  // arrows
  var ax=left+fullW+14,ay=top+H0*0.35;
  S("path",{d:"M"+ax+" "+ay+" h"+(arrowW-32)+" l-8 -6 m8 6 l-8 6",stroke:"#475569","stroke-width":2,fill:"none"},svg);
  T(svg,ax+(arrowW-28)/2,ay-10,noShard?"replicate":"shard ÷ N",{"text-anchor":"middle","font-weight":"600"});
  T(svg,ax+(arrowW-28)/2,ay+22,noShard?"all-reduce grads":"AG → compute",{"text-anchor":"middle","class":"mute"});
  T(svg,ax+(arrowW-28)/2,ay+36,noShard?"":"→ RS grads",{"text-anchor":"middle","class":"mute"});
  // rank columns
  var x0=left+fullW+arrowW;
  var kinds=[["Param",1,"fp32 master shard"],["Grad",1,"fp32 gradient shard"],["Opt",k,"optimizer state ("+k+"× per parameter"+(kAssumed?", assumed Adam":"")+")"]];
  for(var r=0;r<N;r++){
    var cx=x0+r*(colW+colGap);
    T(svg,cx+colW/2,top-26,"G"+r,{"text-anchor":"middle","font-weight":"700","font-size":"15","data-rank-col":"G"+r});
    var restR=rankP*(2+k);
    T(svg,cx+colW/2,top-12,fb(restR),{"text-anchor":"middle","class":"mute"});
    kinds.forEach(function(kd,ki){
      var bx=cx+ki*(barW+gap),by=top;
      if(kd[1]===0){T(svg,bx+barW/2,top+12,"none",{"text-anchor":"middle","class":"mute"});}
      units.forEach(function(u,i){
        var S_=noShard?(u.padded_numel||u.numel):u.shard_numel,lo=noShard?0:r*S_,hi=lo+S_;
        var h=S_*mb*kd[1]*scale;if(h<=0)return;
        var g=S("g",{"data-unit":i},svg);
        // pieces: parameters overlapping [lo,hi), then padding
        var pieces=[];(u.params||[]).forEach(function(p){var a=Math.max(lo,p.offset),b=Math.min(hi,p.offset+p.numel);if(b>a)pieces.push([a,b,p]);});
        var pa=Math.max(lo,u.numel),pb_=hi;if(pb_>pa)pieces.push([pa,pb_,null]);
        if(!pieces.length)pieces.push([lo,hi,undefined]);
        pieces.forEach(function(pc){
          var ph=(pc[1]-pc[0])*mb*kd[1]*scale,py=by+(pc[0]-lo)*mb*kd[1]*scale;
          var fill=pc[2]===null?"url(#pad)":ucol(i,ki===0?56:ki===1?68:78);
          var label=pc[2]===null?"padding of "+uname(u)+": elements ["+pc[0]+", "+pc[1]+") — zeros so every rank's shard has the same size":
            pc[2]===undefined?uname(u)+" elements ["+pc[0]+", "+pc[1]+")":
            pc[2].name+" ["+(pc[2].shape||[]).join(", ")+"]\nelements ["+(pc[0]-pc[2].offset)+", "+(pc[1]-pc[2].offset)+") of "+pc[2].numel+" ("+(100*(pc[1]-pc[0])/pc[2].numel).toFixed(1)+"%)";
          tip(S("rect",{x:bx,y:py,width:barW,height:Math.max(ph,0.4),fill:fill},g),
            "G"+r+" · "+kd[0]+" · unit "+uname(u)+"\n"+label+"\n"+fb((pc[1]-pc[0])*mb*kd[1])+" ("+kd[2]+")");
          if(ph>4)S("line",{x1:bx,x2:bx+barW,y1:py+ph,y2:py+ph,stroke:"#fff","stroke-width":0.7},g);
        });
        by+=h;
      });
      S("rect",{x:bx,y:top,width:barW,height:Math.max(by-top,0),fill:"none",stroke:"#94a3b8","stroke-width":0.8},svg);
      T(svg,bx+barW/2,Math.max(by,top)+14,kd[0],{"text-anchor":"middle","font-weight":"600"});
      T(svg,bx+barW/2,Math.max(by,top)+27,fb(by>top?(by-top)/scale:0),{"text-anchor":"middle","class":"mute","font-size":"10"});
    });
  }
  var defs=S("defs",{},svg),pat=S("pattern",{id:"pad",width:5,height:5,patternUnits:"userSpaceOnUse",patternTransform:"rotate(45)"},defs);
  S("rect",{width:5,height:5,fill:"#e2e8f0"},pat);S("line",{x1:0,y1:0,x2:0,y2:5,stroke:"#94a3b8","stroke-width":2},pat);
  var lg=document.getElementById("map-legend");
  units.forEach(function(u,i){var s=H("span");var ii=H("i");ii.style.background=ucol(i);s.appendChild(ii);s.appendChild(document.createTextNode(uname(u)+" ("+fn(u.numel)+")"));s.setAttribute("data-unit-name",uname(u));lg.appendChild(s);});
  var s=H("span");var ii=H("i");ii.style.background="#cbd5e1";s.appendChild(ii);s.appendChild(document.createTextNode("padding"));lg.appendChild(s);
  var eq=document.getElementById("ledger-eq"),P=padded*mb,lines=[];
  lines.push("P = "+fn(numel)+" params × "+mb+" B = "+fb(numel*mb)+"   (padded to multiples of N: "+fb(P)+")");
  if(noShard)lines.push("NO_SHARD: every rank holds P + G + O = "+fb(P)+" + "+fb(P)+" + "+fb(k*P)+" = "+fb((2+k)*P));
  else lines.push("(P + G + O) / N = ("+fb(P)+" + "+fb(P)+" + "+fb(k*P)+") / "+N+" = "+fb((2+k)*P/N)+" per rank");
  if(led0){
    lines.push("P_block = "+fb(led0.P_block)+(led0.P_block_unit!=null?" (unit "+(led0.P_block_unit||"<root>")+")":"")+"   A = "+fb(led0.A));
    lines.push("predicted: resting "+fb(led0.predicted_rest)+", peak "+fb(led0.predicted_peak)+"  ·  measured peak (rank 0) "+fb(ranks[0].peak));
  }
  eq.textContent=lines.join("\n");
});

// ---- timeline ----
var laneDefs=[["ag","AG"],["compute","compute"],["rs","RS"],["ckpt","ckpt"]];
function laneOf(l){return l==="forward"||l==="backward"||l==="optim"||l==="other"?"compute":l;}
function colOf(s){var l=s[2],n=s[3];if(l==="ag")return "var(--ag)";if(l==="rs")return n==="reduce_scatter"?"var(--rs)":"var(--ar)";if(l==="forward")return "var(--fwd)";if(l==="backward")return "var(--bwd)";if(l==="optim")return "var(--opt)";if(l==="ckpt")return "var(--ckpt)";return "var(--other)";}
function drawTimeline(t0,t1){
  var box=document.getElementById("timeline");box.textContent="";
  var W=1260,left=92,right=16,laneH=18,rankGap=16,top=26;
  var anyCkpt=ranks.some(function(r){return (r.ckpt||[]).length>0;});
  var lanes=laneDefs.filter(function(l){return l[0]!=="ckpt"||anyCkpt;});
  var rankH=14+lanes.length*(laneH+3);
  var Ht=top+ranks.length*(rankH+rankGap)+8;
  var svg=SV(box,W,Ht,"timeline");
  var span=Math.max(t1-t0,1e-6),sx=function(t){return left+(t-t0)/span*(W-left-right);};
  var step=nice(span,8),g=S("g",{"class":"grid"},svg);
  for(var t=Math.ceil(t0/step)*step;t<=t1+1e-9;t+=step){var x=sx(t);S("line",{x1:x,x2:x,y1:top-6,y2:Ht-6},g);T(svg,x,top-10,fms(t),{"text-anchor":"middle","class":"mute","font-size":"10"});}
  ranks.forEach(function(r,ri){
    var y0=top+ri*(rankH+rankGap);
    T(svg,6,y0+12,"G"+r.rank,{"font-weight":"700","font-size":"13"});
    (r.steps||[]).forEach(function(s){if(s.t1<t0||s.t0>t1)return;var a=sx(Math.max(s.t0,t0)),b=sx(Math.min(s.t1,t1));
      tip(S("rect",{x:a,y:y0,width:Math.max(b-a,1),height:9,rx:2,fill:"#cbd5e1"},svg),"step "+s.step+": "+fms(s.t1-s.t0)+(s.loss!=null?" · loss "+Number(s.loss).toFixed(4):"")+" · sent "+fb(s.total_bytes));
      if(b-a>70)T(svg,a+4,y0+8,"step "+s.step+" · "+fms(s.t1-s.t0),{"font-size":"9","class":"mute"});});
    lanes.forEach(function(l,li){
      var ly=y0+14+li*(laneH+3);
      S("rect",{x:left,y:ly,width:W-left-right,height:laneH,fill:"#f8fafc"},svg);
      T(svg,left-8,ly+13,l[1],{"text-anchor":"end","class":"mute"});
      // nesting depth within a lane (a root forward encloses its children)
      var items=(r.spans||[]).filter(function(s){return s[2]!=="step"&&laneOf(s[2])===l[0]&&s[0]+s[1]>=t0&&s[0]<=t1;});
      items.sort(function(a,b){return a[0]-b[0]||b[1]-a[1];});
      var stack=[];
      items.forEach(function(s){
        while(stack.length&&stack[stack.length-1]<=s[0]+1e-9)stack.pop();
        var d=Math.min(stack.length,3);stack.push(s[0]+s[1]);
        var a=sx(Math.max(s[0],t0)),b=sx(Math.min(s[0]+s[1],t1));
        var hh=laneH-d*4;
        tip(S("rect",{x:a,y:ly+d*4,width:Math.max(b-a,0.6),height:hh,fill:colOf(s),stroke:d?"#fff":"none","stroke-width":0.5},svg),
          s[3]+(s[4]?" "+s[4]:"")+"\n"+fms(s[1])+" at "+fms(s[0])+(s[5]?"\n"+fb(s[5])+" sent":"")+"\nthread "+((r.threads||{})[s[6]]||s[6]));
        if(b-a>46&&d===0)T(svg,a+3,ly+12,(s[4]||s[3]).slice(0,Math.floor((b-a)/6)),{fill:"#fff","font-size":"10"});
      });
    });
  });
}
section("timeline",function(){
  var btns=document.getElementById("step-btns"),st=ranks[0]?(ranks[0].steps||[]):[];
  var end=D.t_end||1;
  function win(i){var a=Infinity,b=-Infinity;ranks.forEach(function(r){var s=(r.steps||[])[i];if(s){a=Math.min(a,s.t0);b=Math.max(b,s.t1);}});return [a,b];}
  var choices=[["all run",0,end]];
  st.forEach(function(s,i){var w=win(i);choices.push(["step "+s.step,w[0],w[1]]);});
  var chosen=choices.length>2?2:0; // a steady step (not the first, which warms up) reads best
  choices.forEach(function(c,i){var b=H("button",{type:"button"},c[0]);if(i===chosen)b.className="on";
    b.addEventListener("click",function(){btns.querySelectorAll("button").forEach(function(x){x.className="";});b.className="on";try{drawTimeline(c[1],c[2]);}catch(e){fail("timeline",e);}});btns.appendChild(b);});
  var c=choices[chosen];var pad=(c[2]-c[1])*0.01;drawTimeline(Math.max(0,c[1]-pad),c[2]+pad);
});

// ---- memory ----
var rcol=["#2563eb","#dc2626","#059669","#d97706","#7c3aed","#0891b2","#db2777","#4b5563"];
section("memory",function(){
  var box=document.getElementById("memory");
  var has=ranks.some(function(r){return (r.memory||[]).length>0;});
  if(!has){box.appendChild(H("p",{"class":"warn"},"No \"memory\" counter events: install the counting allocator (fsdp::memory::install) before tracing, or emit fsdp::trace::counter(\"memory\", {{\"current\",..},{\"peak\",..}})."));return;}
  var W=1260,Hh=300,left=78,right=190,top=14,bottom=28;
  var end=D.t_end||1,ymax=0;
  ranks.forEach(function(r){(r.memory||[]).forEach(function(p){ymax=Math.max(ymax,p[1]);});end=Math.max(end,(r.memory||[]).length?r.memory[r.memory.length-1][0]:0);});
  var preds=[];ranks.forEach(function(r){var l=r.meta&&r.meta.ledger;if(l){if(l.predicted_rest)preds.push(["resting (P+G+O)/N",l.predicted_rest,"#64748b",r.rank]);if(l.predicted_peak)preds.push(["peak P/N + P_block + A",l.predicted_peak,"#b91c1c",r.rank]);}});
  // identical predictions on every rank are drawn once
  var seen={},uniq=[];preds.forEach(function(p){var key=p[0]+p[1];if(!seen[key]){seen[key]=1;uniq.push(p);}});
  uniq.forEach(function(p){ymax=Math.max(ymax,p[1]);});ymax*=1.1;
  var svg=SV(box,W,(Hh+top+bottom),"memory");
  var sx=function(t){return left+t/end*(W-left-right);},sy=function(v){return top+Hh-v/ymax*Hh;};
  var st=ranks[0]?(ranks[0].steps||[]):[];
  st.forEach(function(s,i){if(i%2===0)S("rect",{x:sx(s.t0),y:top,width:Math.max(sx(s.t1)-sx(s.t0),0.5),height:Hh,fill:"#f1f5f9"},svg);});
  var yt=niceBytes(ymax,5),g=S("g",{"class":"grid"},svg);
  for(var v=0;v<=ymax;v+=yt){S("line",{x1:left,x2:W-right,y1:sy(v),y2:sy(v)},g);T(svg,left-6,sy(v)+4,fb(v),{"text-anchor":"end","class":"mute","font-size":"10"});}
  var xt=nice(end,8);for(var t=0;t<=end;t+=xt)T(svg,sx(t),top+Hh+16,fms(t),{"text-anchor":"middle","class":"mute","font-size":"10"});
  uniq.forEach(function(p,i){S("line",{x1:left,x2:W-right,y1:sy(p[1]),y2:sy(p[1]),stroke:p[2],"stroke-dasharray":"6 4","stroke-width":1.4},svg);
    T(svg,W-right+6,sy(p[1])+4+(i%2?10:0)*0,p[0]+": "+fb(p[1]),{fill:p[2],"font-size":"10.5"});});
  ranks.forEach(function(r,ri){var pts=(r.memory||[]).map(function(p){return sx(p[0]).toFixed(1)+","+sy(p[1]).toFixed(1);});
    if(pts.length)S("polyline",{points:pts.join(" "),fill:"none",stroke:rcol[ri%rcol.length],"stroke-width":1.5,"stroke-linejoin":"round"},svg);
    var best=null;(r.memory||[]).forEach(function(p){if(!best||p[1]>best[1])best=p;});
    if(best)tip(S("circle",{cx:sx(best[0]),cy:sy(best[1]),r:3.5,fill:rcol[ri%rcol.length]},svg),"G"+r.rank+" peak "+fb(best[1])+" at "+fms(best[0]));
    (r.ckpt||[]).forEach(function(c){tip(S("path",{d:"M"+sx(c.t)+" "+(top+1)+" l-5 -0 l5 8 l5 -8 z",fill:"var(--ckpt)"},svg),"checkpoint "+c.name+" "+(c.path||""));});
  });
  var lg=document.getElementById("memory-legend");
  ranks.forEach(function(r,ri){var s=H("span");var ii=H("i");ii.style.background=rcol[ri%rcol.length];s.appendChild(ii);s.appendChild(document.createTextNode("G"+r.rank+" (peak "+fb(r.peak)+")"));lg.appendChild(s);});
});

// ---- traffic ----
section("traffic",function(){
  var box=document.getElementById("traffic"),L=D.traffic_lines||{};
  var nSteps=Math.max.apply(null,ranks.map(function(r){return (r.steps||[]).length;}).concat([0]));
  if(!nSteps){box.appendChild(H("p",{"class":"warn"},"No \"step\" spans: the trainer must wrap each optimizer step in fsdp::trace::Span(\"step\", \"step\", {{\"step\", s}})."));return;}
  var W=1260,Hh=240,left=78,right=200,top=14,bottom=30;
  var ymax=0;ranks.forEach(function(r){(r.steps||[]).forEach(function(s){ymax=Math.max(ymax,s.total_bytes);});});
  [L.full_3p,L.grad_op_2p,L.ddp_2p].forEach(function(v){if(v)ymax=Math.max(ymax,v);});ymax=(ymax||1)*1.12;
  var svg=SV(box,W,(Hh+top+bottom),"traffic");
  var sy=function(v){return top+Hh-v/ymax*Hh;};
  var yt=niceBytes(ymax,5),g=S("g",{"class":"grid"},svg);
  for(var v=0;v<=ymax;v+=yt){S("line",{x1:left,x2:W-right,y1:sy(v),y2:sy(v)},g);T(svg,left-6,sy(v)+4,fb(v),{"text-anchor":"end","class":"mute","font-size":"10"});}
  var slot=(W-left-right)/nSteps,bw=Math.min(26,slot*0.8/Math.max(ranks.length,1));
  for(var i=0;i<nSteps;i++){
    var cx=left+slot*i+slot/2-bw*ranks.length/2;
    ranks.forEach(function(r,ri){var s=(r.steps||[])[i];if(!s)return;var y=top+Hh,x=cx+ri*bw;
      [["ag_bytes","var(--ag)","all-gather"],["rs_bytes","var(--rs)","reduce-scatter"],["ar_bytes","var(--ar)","all-reduce"],["other_bytes","var(--other)","other"]].forEach(function(p){
        var h=s[p[0]]/ymax*Hh;if(h<=0)return;y-=h;tip(S("rect",{x:x+0.5,y:y,width:bw-1,height:h,fill:p[1]},svg),"G"+r.rank+" step "+s.step+": "+p[2]+" "+fb(s[p[0]])+"\ntotal "+fb(s.total_bytes));});
    });
    if(slot>26||i%Math.ceil(26/slot)===0)T(svg,left+slot*i+slot/2,top+Hh+15,String(ranks[0].steps[i]?ranks[0].steps[i].step:i),{"text-anchor":"middle","class":"mute","font-size":"10"});
  }
  T(svg,left+(W-left-right)/2,top+Hh+28,"step",{"text-anchor":"middle","class":"mute","font-size":"10"});
  var ls=[["3P·(N−1)/N  FULL_SHARD",L.full_3p,"#1d4ed8"],["2P·(N−1)/N  SHARD_GRAD_OP",L.grad_op_2p,"#0f766e"]];
  if(L.ddp_2p&&Math.abs(L.ddp_2p-L.grad_op_2p)>1)ls.push(["2P·(N−1)/N  NO_SHARD (DDP)",L.ddp_2p,"#7c2d12"]);else if(L.ddp_2p)ls[1][0]="2P·(N−1)/N  SHARD_GRAD_OP, DDP";
  ls.forEach(function(l,i){if(!l[1])return;S("line",{x1:left,x2:W-right,y1:sy(l[1]),y2:sy(l[1]),stroke:l[2],"stroke-dasharray":"6 4","stroke-width":1.4},svg);T(svg,W-right+6,sy(l[1])+4,l[0]+": "+fb(l[1]),{fill:l[2],"font-size":"10.5"});});
  // table: per rank, mean over steps
  var exp=D.strategy==="NO_SHARD"?L.ddp_2p:D.strategy==="SHARD_GRAD_OP"?L.grad_op_2p:L.full_3p;
  var tb=H("table"),hr=H("tr");["rank","steps","all-gather / step","reduce-scatter / step","all-reduce / step","total / step","formula ("+(D.strategy||"FULL_SHARD")+")","measured / formula"].forEach(function(h){hr.appendChild(H("th",{},h));});tb.appendChild(hr);
  ranks.forEach(function(r){var s=r.steps||[];var tr=H("tr");var tot=mean(s.map(function(x){return x.total_bytes;}));
    ["G"+r.rank,String(s.length),fb(mean(s.map(function(x){return x.ag_bytes;}))),fb(mean(s.map(function(x){return x.rs_bytes;}))),fb(mean(s.map(function(x){return x.ar_bytes;}))),fb(tot),exp?fb(exp):"–",exp&&!isNaN(tot)?(100*tot/exp).toFixed(2)+"%":"–"].forEach(function(c){tr.appendChild(H("td",{},c));});tb.appendChild(tr);});
  document.getElementById("traffic-table").appendChild(tb);
});

// ---- checkpoints ----
section("ckpt",function(){
  var box=document.getElementById("ckpt"),rows=[];
  ranks.forEach(function(r){(r.ckpt||[]).forEach(function(c){rows.push([r.rank,c]);});});
  if(!rows.length){box.appendChild(H("p",{"class":"lead"},"No checkpoint events in this trace (cat \"ckpt\": spans \"save\" / \"load\")."));return;}
  rows.sort(function(a,b){return a[1].t-b[1].t||a[0]-b[0];});
  var tb=H("table"),hr=H("tr");["rank","event","step","at","duration","bytes","path"].forEach(function(h,i){hr.appendChild(H("th",i===6?{"class":"l"}:{},h));});tb.appendChild(hr);
  rows.forEach(function(x){var c=x[1],tr=H("tr");["G"+x[0],c.name,c.step==null?"–":String(c.step),fms(c.t),c.dur?fms(c.dur):"–",c.bytes?fb(c.bytes):"–",c.path||""].forEach(function(v,i){tr.appendChild(H("td",i===6?{"class":"l"}:{},v));});tb.appendChild(tr);});
  box.appendChild(tb);
});

// ---- units ----
section("units",function(){
  var box=document.getElementById("units");
  if(!units.length){box.appendChild(H("p",{"class":"lead"},"No unit metadata."));return;}
  var tb=H("table"),hr=H("tr");["#","unit","parameters","numel","padded","shard / rank","unsharded bytes (P_block)","shard bytes"].forEach(function(h,i){hr.appendChild(H("th",i<2?{"class":"l"}:{},h));});tb.appendChild(hr);
  var big=0;units.forEach(function(u){big=Math.max(big,u.unsharded_bytes||0);});
  units.forEach(function(u,i){var tr=H("tr");[String(u.index!=null?u.index:i),uname(u),String((u.params||[]).length),fn(u.numel),fn(u.padded_numel),fn(u.shard_numel),fb(u.unsharded_bytes)+(u.unsharded_bytes===big&&big?"  ← largest":""),fb(u.shard_bytes)].forEach(function(v,j){var td=H("td",j<2?{"class":"l"}:{},v);if(j===1){var sw=H("i");sw.style.cssText="display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;background:"+ucol(i);td.insertBefore(sw,td.firstChild);}tr.appendChild(td);});tb.appendChild(tr);});
  box.appendChild(tb);
});

document.getElementById("status").textContent="fsdp report · rendered "+rendered.join(", ")+" · open trace.json in ui.perfetto.dev for every event";
if(!errBox.textContent)document.body.setAttribute("data-rendered","ok");
})();
</script>
</body></html>
)FSDPHTML";

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size())) s.replace(p, what.size(), with);
}

}  // namespace

int64_t write_html(const nlohmann::json& model, const std::string& out_path, const std::string& title) {
  // Inside <script>, "</script>" or "<!--" in a string would end the block:
  // JSON allows "<" as \u003c, so no '<' reaches the page raw.
  std::string data = model.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  replace_all(data, "<", "\\u003c");
  std::string page = kTemplate;
  replace_all(page, "__TITLE__", html_escape(title));
  size_t p = page.find("__DATA__");
  FSDP_CHECK(p != std::string::npos, "report template lost its data placeholder");
  page.replace(p, 8, data);
  std::string tmp = out_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    FSDP_USER_CHECK(f.good(), "report: cannot write '", tmp, "'. Pass -o with a writable path.");
    f << page;
    f.flush();
    FSDP_USER_CHECK(f.good(), "report: writing '", tmp, "' failed (disk full?).");
  }
  FSDP_USER_CHECK(std::rename(tmp.c_str(), out_path.c_str()) == 0, "report: cannot rename '", tmp, "' to '",
                  out_path, "'.");
  return static_cast<int64_t>(page.size());
}

}  // namespace fsdp::report
