# The report (`snakemake --report report.html`): on its front page (workflow/report/workflow.rst) each
# study's answer, headline numbers and first plots; each study's page (src/trainbench/reporting/report.py:
# its markdown table file rendered with its plots in reading order, where and with what its cells ran);
# and the tables themselves, each under its study's category with a caption (workflow/report/*.rst).


rule study_page:
    input:
        # the page shows the table as it is and the plots: asking for it brings the whole study up to
        # date
        table=paths.TABLE_MD,
        every_column=paths.TABLE_ALL,
        findings=paths.TABLE_FINDINGS,
        plots=paths.PLOTS_DIR,
        metrics=get_study_metrics,
    output:
        # the page kept beside the table, its plots linked (a few kilobytes in the repository)
        page=paths.STUDY_PAGE,
        # the same page with its plots embedded, as the report's viewer needs: not kept in the repository
        report_page=report(
            paths.REPORT_PAGE,
            caption="../report/study_page.rst",
            category="{study}",
            subcategory="page",
            # short: the report lists it beside the page it shows, in a column as wide as its labels
            labels={"shows": "answer, plots, findings, provenance"},
        ),
        # an HTML fragment the front page takes in as it is, beside the report's page
        front=paths.STUDY_FRONT,
    log:
        paths.STUDY_PAGE_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/make_page.py"


rule report_all:
    """The page (and the report's copy), table and plots of every study that has a table on disk (the
    published studies, and any made here): `snakemake -c all report_all`, then `snakemake --report
    report.html report_all` (docs/running.md)."""
    input:
        get_pages_of_tabled_studies(),
    localrule: True
